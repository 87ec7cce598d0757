"""The shared language of writers and readers: events, commands, errors, codec.

Imports nothing of ours.
"""
