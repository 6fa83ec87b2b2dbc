"""``python -m hybridkv.cli``: the ``hybridkv`` command."""

from hybridkv.cli import main

raise SystemExit(main())
