"""Build the C extensions of the packages present here, and collect their .so files for the runtime stage.

Run in an image's build stage, in a folder holding setup.py, pyproject.toml and that image's packages only:
`python build_native.py OUT`. setup.py declares every extension of the project; an extension whose sources
are not here belongs to another image and is skipped; one whose sources are here must build (setup.py marks
them optional, so a compile error would otherwise pass silently). Every built .so is copied to OUT under its
package path, so that `COPY --from=native OUT /app/` adds the compiled modules and nothing else.
Standard library and setuptools only.
"""

import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

import setuptools


def declared() -> dict[str, Any]:
    """The arguments setup.py gives setup(): setup.py run with a setup() that only records them."""
    found: dict[str, Any] = {}
    real = setuptools.setup
    setuptools.setup = lambda **kwargs: found.update(kwargs)  # type: ignore[assignment]
    try:
        exec(compile(Path("setup.py").read_text(), "setup.py", "exec"), {"__name__": "__main__"})
    finally:
        setuptools.setup = real
    return found


def main() -> None:
    """Build in place, check that every extension whose sources are here was built, copy the .so files."""
    if len(sys.argv) != 2:
        raise SystemExit("usage: build_native.py OUT")
    out = Path(sys.argv[1])
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    arguments = declared()
    extensions = list(arguments.get("ext_modules") or [])
    local = [ext for ext in extensions if all(Path(s).is_file() for s in ext.sources)]
    skipped = sorted({ext.name for ext in extensions} - {ext.name for ext in local})
    if skipped:
        print(f"build_native: not in this image, skipped: {', '.join(skipped)}")
    if local:  # setup.py's own setup(), given only the extensions whose sources are here
        setuptools.setup(**{**arguments, "ext_modules": local}, script_args=["-q", "build_ext", "--inplace"])
    missing = [ext.name for ext in local if not Path(ext.name.replace(".", "/") + suffix).is_file()]
    if missing:
        raise SystemExit(f"ctr-build: the C extension(s) {', '.join(missing)} did not compile (log above)")
    for so in sorted(Path().rglob("*.so")):
        if "build" in so.parts[:1]:
            continue  # setuptools' build/ folder: the in-place copies are the ones next to the sources
        (out / so.parent).mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, out / so)
        print(f"build_native: {so}")
    out.mkdir(parents=True, exist_ok=True)  # COPY --from needs the folder even when nothing was built


if __name__ == "__main__":
    main()
