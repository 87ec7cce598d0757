"""The dashboard's static files (HTML, hand-written JS and CSS), served by ledger.server.web."""
