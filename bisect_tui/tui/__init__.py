"""The Textual app of bisect-tui (`make_app` in app.py is the entry point)."""
