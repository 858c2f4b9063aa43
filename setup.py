"""Builds the Python package `pinpool` (pyproject.toml) with setuptools.

Two extension modules, from this repository's C sources:
- pinpool._core: python/pinpoolmodule.c with the library (src/) compiled
  in, so that a `pip install` needs nothing else installed;
- pinpool._cli: the command-line tool (tools/, python/climodule.c) for
  `python3 -m pinpool`. It reads snapshots with libjansson: without
  libjansson-dev (found through pkg-config) it is left out with a warning,
  and the rest of the package works; PINPOOL_REQUIRE_CLI=1 makes that an
  error (the tests set it).
The library is compiled once, as a static library linked into both
(setuptools' build_clib); -fPIC comes from Python's own compiler flags.

The version is the C library's: PINPOOL_VERSION_STRING of
include/pinpool.h, the one place it is written for the package.
"""

import os
import re
import shutil
import subprocess
import sys
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def rel(*parts):
    # setuptools wants paths relative to setup.py.
    return os.path.join(*parts)


def version():
    with open(os.path.join(ROOT, "include", "pinpool.h"),
              encoding="utf-8") as f:
        m = re.search(r'#define\s+PINPOOL_VERSION_STRING\s+"([^"]+)"',
                      f.read())
    if m is None:
        sys.exit("setup.py: no PINPOOL_VERSION_STRING in include/pinpool.h")
    return m.group(1)


# The flags of the CMake build that matter for the code (CMakeLists.txt):
# C11, hidden symbols, the library's own define.
C_FLAGS = ["-std=c11", "-fvisibility=hidden", "-O2", "-g"]

LIBRARY = ("pinpool_lib", {
    "sources": sorted(glob(rel("src", "*.c"))),
    "include_dirs": [rel("include"), rel("src")],
    "macros": [("PINPOOL_BUILDING", None)],
    "cflags": C_FLAGS,
})

core = Extension(
    "pinpool._core",
    sources=[rel("python", "pinpoolmodule.c")],
    include_dirs=[rel("include"), rel("python")],
    extra_compile_args=C_FLAGS,
    # The static library first: the system libraries it needs come after.
    libraries=["pinpool_lib", "pthread", "dl", "m"],
)

TOOL_SOURCES = ["pinpool.c", "cli.c", "demo.c", "demo_pipeline.c",
                "demo_report.c", "snapshot.c",
                "snapshot_load.c", "snapshot_summarize.c", "snapshot_summary.c",
                "snapshot_diff.c", "snapshot_html.c",
                "snapshot_torch.c", "snapshot_torch_pickle.c",
                "snapshot_torch_trace.c", "snapshot_torch_layout.c", "pickle.c"]


def pkg_config(*args):
    exe = shutil.which("pkg-config")
    if exe is None:
        return None
    r = subprocess.run([exe, *args], capture_output=True, text=True,
                       check=False)
    return r.stdout.split() if r.returncode == 0 else None


def cli_extension():
    cflags = pkg_config("--cflags", "jansson")
    libs = pkg_config("--libs", "jansson")
    if cflags is None or libs is None:
        why = ("libjansson not found by pkg-config (Debian: apt-get "
               "install libjansson-dev pkg-config)")
        if os.environ.get("PINPOOL_REQUIRE_CLI") == "1":
            sys.exit(f"setup.py: PINPOOL_REQUIRE_CLI=1 and {why}")
        print(f"setup.py: WARNING: {why}: pinpool._cli is not built and "
              f"`python3 -m pinpool` will say so", file=sys.stderr)
        return None
    return Extension(
        "pinpool._cli",
        sources=[rel("python", "climodule.c")]
        + [rel("tools", s) for s in TOOL_SOURCES],
        include_dirs=[rel("include"), rel("tools")]
        + [f[2:] for f in cflags if f.startswith("-I")],
        extra_compile_args=C_FLAGS,
        libraries=["pinpool_lib"]
        + [f[2:] for f in libs if f.startswith("-l")]
        + ["pthread", "dl", "m"],
    )


def viewer_file(name):
    with open(os.path.join(ROOT, "tools", "viewer", name), "rb") as f:
        return f.read()


class BuildExt(build_ext):
    """build_ext that first writes the viewer page as C (tools/embed.cmake
    does the same for CMake): `pinpool snapshot html` needs no data file."""

    def run(self):
        for ext in self.extensions:
            if ext.name == "pinpool._cli":
                ext.sources.append(self.viewer_page())
        super().run()

    def viewer_page(self):
        os.makedirs(self.build_temp, exist_ok=True)
        out = os.path.join(self.build_temp, "viewer_page.c")
        data = viewer_file("viewer.html")
        # The style sheet and script go back in place of their <link> and
        # <script src> lines, as tools/embed.cmake does: the page the tool
        # writes is one file (viewer.html says why).
        for tag, head, name, tail in (
                (b'<link rel="stylesheet" href="viewer.css">', b"<style>\n",
                 "viewer.css", b"</style>"),
                (b'<script src="viewer.js"></script>', b"<script>\n",
                 "viewer.js", b"</script>")):
            if data.count(tag) != 1:
                raise RuntimeError(f"viewer.html: no {tag!r} to replace")
            data = data.replace(tag, head + viewer_file(name) + tail)
        body = ",".join(f"0x{b:02x}" for b in data)
        text = ("/* Generated from tools/viewer/viewer.{html,css,js} by "
                "setup.py. */\n"
                "extern const char snap_viewer_page[];\n"
                "extern const unsigned long snap_viewer_page_len;\n"
                f"const char snap_viewer_page[] = {{{body}, 0x00}};\n"
                f"const unsigned long snap_viewer_page_len = {len(data)}UL;\n")
        old = None
        if os.path.exists(out):
            with open(out, encoding="ascii") as f:
                old = f.read()
        if old != text:  # unchanged: no rebuild of the module
            with open(out, "w", encoding="ascii") as f:
                f.write(text)
        return out


extensions = [core]
cli = cli_extension()
if cli is not None:
    extensions.append(cli)

setup(
    version=version(),
    package_dir={"": "python"},
    packages=["pinpool"],
    package_data={"pinpool": ["py.typed", "*.pyi"]},
    libraries=[LIBRARY],
    ext_modules=extensions,
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
