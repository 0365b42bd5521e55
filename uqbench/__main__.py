from uqbench.cli import main

raise SystemExit(main())
