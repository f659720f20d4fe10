from ratewarden.cli import main

raise SystemExit(main())
