from __future__ import annotations

from servetune.cli import main

main()
