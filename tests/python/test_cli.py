"""python3 -m pinpool: the command-line tool compiled into the package
(pinpool._cli; docs/python.md, "The command-line tool"), and where the
imported package is.

pinpool._cli is missing where the package was built without libjansson
(setup.py) and in tests/freethreaded (which builds the core only): those
tests skip then, unless PINPOOL_REQUIRE_CLI=1 (ctest and the installed-
package test set it), where a missing tool fails.
"""

import importlib
import json
import os
import subprocess
import sys

import pytest

import pinpool


def have_cli():
    try:
        importlib.import_module("pinpool._cli")
    except ImportError as e:
        if os.environ.get("PINPOOL_REQUIRE_CLI") == "1":
            pytest.fail(f"pinpool._cli missing: {e}")
        return False
    return True


needs_cli = pytest.mark.skipif("not have_cli()",
                               reason="pinpool._cli not built")


def run(*args, timeout=120):
    env = dict(os.environ)
    env.pop("PINPOOL_CONF", None)
    return subprocess.run([sys.executable, "-m", "pinpool", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)


def test_imported_from_expected_place():
    # The installed-package test (tests/python/package.sh) sets this to the
    # virtual environment: the tests must run against the installed copy,
    # not the build tree or the sources.
    where = os.environ.get("PINPOOL_EXPECT_PACKAGE_UNDER")
    if not where:
        pytest.skip("PINPOOL_EXPECT_PACKAGE_UNDER not set")
    here = os.path.realpath(pinpool.__file__)
    assert here.startswith(os.path.realpath(where) + os.sep), here
    assert os.path.realpath(pinpool._core.__file__).startswith(
        os.path.realpath(where) + os.sep)


@needs_cli
def test_version_matches_the_library():
    r = run("version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (f"pinpool {pinpool.__version__} "
                                f"(library {pinpool.__version__})")


@needs_cli
def test_help_and_usage_errors():
    r = run("help")
    assert r.returncode == 0 and "snapshot" in r.stdout
    r = run()
    assert r.returncode == 2 and "usage: pinpool" in r.stderr
    r = run("no-such-command")
    assert r.returncode == 2 and "unknown command" in r.stderr
    r = run("demo", "--seconds", "x")
    assert r.returncode == 2


@needs_cli
def test_demo_and_snapshot_summary(tmp_path):
    snap = tmp_path / "demo.json"
    r = run("demo", "--seconds", "0.3", "--producers", "2", "--snapshot",
            str(snap))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(snap.read_text())["stats"]
    r = run("snapshot", "summary", str(snap))
    assert r.returncode == 0, r.stderr
    html = tmp_path / "demo.html"
    r = run("snapshot", "html", str(snap), "-o", str(html))
    assert r.returncode == 0 and html.stat().st_size > 1000, r.stderr


@needs_cli
def test_in_process_main_returns_status(capfd):
    from pinpool.__main__ import main

    assert main(["version"]) == 0
    assert main(["nope"]) == 2
    out, err = capfd.readouterr()
    assert "pinpool " in out and "unknown command" in err
    with pytest.raises(TypeError):
        pinpool._cli.main("version")
    with pytest.raises(ValueError):
        pinpool._cli.main([])
    with pytest.raises(TypeError):
        pinpool._cli.main(["pinpool", 3])
