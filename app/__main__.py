"""`python -m app` opens the desktop app, as `tandem` does."""
from .main import main

raise SystemExit(main())
