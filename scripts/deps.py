"""Helper for the Makefile: the Python dependency set read from pyproject.toml (one source of truth).

  deps.py key             short hash of the dependency lists (names the shared deps venv)
  deps.py list            the requirements to install (runtime + test extra)
  deps.py link DEPS       make the running venv see DEPS's site-packages and this checkout's
                          python/ (.pth files), and write the project's console scripts
  deps.py maturin ARGS    run maturin (the system one, else the deps venv's)
"""
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def requirements():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    reqs = list(project["dependencies"]) + list(project["optional-dependencies"]["test"])
    return reqs + ["maturin>=1.5,<2"]


def main(argv):
    cmd = argv[1] if len(argv) > 1 else "list"
    if cmd == "key":
        blob = "\n".join(requirements()) + f"\npy{sys.version_info[0]}.{sys.version_info[1]}"
        print(hashlib.sha256(blob.encode()).hexdigest()[:12])
    elif cmd == "list":
        print(" ".join(f"'{r}'" for r in requirements()))
    elif cmd == "link":
        deps = os.path.abspath(argv[2])
        ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
        site = os.path.join(deps, "lib", ver, "site-packages")
        with open(os.path.join(sysconfig.get_paths()["purelib"], "_yoco_deps.pth"), "w") as f:
            f.write(site + "\n")
        # The package itself runs from the checkout (maturin builds `_core` in place with
        # --skip-install), so setting up a clone needs no network and no pip resolution.
        with open(os.path.join(sysconfig.get_paths()["purelib"], "_yoco_src.pth"), "w") as f:
            f.write(os.path.join(ROOT, "python") + "\n")
        bindir = os.path.join(sys.prefix, "bin")
        with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
            scripts = dict(tomllib.load(f)["project"].get("scripts", {}))
        scripts["pytest"] = "pytest:console_main"  # users expect it in the project venv
        for name, target in scripts.items():
            module, func = target.split(":")
            path = os.path.join(bindir, name)
            with open(path, "w") as f:
                f.write(f"#!{sys.executable}\nimport sys\nfrom {module} import {func}\nsys.exit({func}())\n")
            os.chmod(path, 0o755)
    elif cmd == "maturin":
        exe = shutil.which("maturin") or os.path.join(os.path.dirname(sys.executable), "maturin")
        if not os.path.exists(exe):
            exe = None
        args = argv[2:]
        if exe is None:
            sys.exit(subprocess.call([sys.executable, "-m", "maturin", *args], cwd=ROOT))
        sys.exit(subprocess.call([exe, *args], cwd=ROOT))
    else:
        sys.exit(f"deps.py: unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv)
