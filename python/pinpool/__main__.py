"""python3 -m pinpool ARGS: the pinpool command-line tool (tools/), the
same program as the `pinpool` command, compiled into the package
(pinpool._cli, python/climodule.c)."""

import os
import sys
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Run the tool with argv (default: sys.argv[1:]); its exit status."""
    try:
        from pinpool import _cli
    except ImportError as e:
        # setup.py leaves the tool out where libjansson was missing.
        print(f"pinpool: the command-line tool was not built into this "
              f"package ({e}); rebuild it with libjansson-dev installed",
              file=sys.stderr)
        return 1
    args = sys.argv[1:] if argv is None else list(argv)
    # `snapshot torch` writes the layout of the torch this interpreter
    # imports (tools/snapshot_torch.c asks $PINPOOL_PYTHON, else python3).
    os.environ.setdefault("PINPOOL_PYTHON", sys.executable)
    return _cli.main(["pinpool"] + args)


if __name__ == "__main__":
    sys.exit(main())
