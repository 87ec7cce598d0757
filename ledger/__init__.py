"""The write side: pure domain, the eventsourcing application, dispatcher, relay, executors, CLI."""
