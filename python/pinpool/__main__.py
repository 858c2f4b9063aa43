"""python3 -m pinpool ARGS: the pinpool command-line tool (tools/), the
same program as the `pinpool` command, compiled into the package
(pinpool._cli, python/climodule.c)."""

import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Run the tool with argv (default: sys.argv[1:]); its exit status."""
    from pinpool import _cli

    args = sys.argv[1:] if argv is None else list(argv)
    return _cli.main(["pinpool"] + args)


if __name__ == "__main__":
    sys.exit(main())
