from bisect_tui.cli import main

raise SystemExit(main())
