from accy.cli import main

raise SystemExit(main())
