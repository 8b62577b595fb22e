from bisect_tui.cli import entry

entry()
