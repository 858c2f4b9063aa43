# pinpool._cli: the command-line tool, in-process (python/climodule.c).
from typing import Sequence

def main(argv: Sequence[str], /) -> int: ...
