# Shortcuts for the documented commands (README, docs/benchmarks.md). The
# scripts do the work (and install what they need as root); this file only
# names them, so that `make bench` does what the issue asks of it.
.PHONY: demo test bench bench-quick

demo:
	scripts/demo.sh

test:
	scripts/test.sh

bench:
	bench/run.sh

bench-quick:
	bench/run.sh --quick
