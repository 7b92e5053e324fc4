"""A PEP 517 build backend in the standard library alone.

`pip install ./clients/python` builds in an isolated environment, and would
first download a build backend (setuptools, wheel) from the Python package
index. The project's machines and CI reach no such index, and the package
itself needs nothing but the standard library, so its build does not
either: this writes the wheel (a zip with a dist-info) and the sdist
directly. Metadata comes from the [project] table of pyproject.toml.
"""

import base64
import hashlib
import io
import os
import re
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "queen_locks"


def _project():
    """The [project] table's plain string fields."""
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    table = re.search(r"^\[project\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S).group(1)
    return dict(re.findall(r'^([\w-]+)\s*=\s*"([^"]*)"\s*$', table, re.M))


def _metadata():
    p = _project()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {p['name']}\n"
        f"Version: {p['version']}\n"
        f"Summary: {p['description']}\n"
        f"Requires-Python: {p['requires-python']}\n"
        "Description-Content-Type: text/markdown\n"
        f"\n{readme}"
    )


def _dist_name():
    p = _project()
    return re.sub(r"[-_.]+", "_", p["name"]).lower(), p["version"]


def _sources():
    """The package's files, as (path in the archive, path on disk)."""
    pkg = os.path.join(ROOT, PACKAGE)
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py") or name == "py.typed":
            yield f"{PACKAGE}/{name}", os.path.join(pkg, name)


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}\n"


def _wheel(wheel_directory, files):
    """Writes a py3-none-any wheel holding files (archive path to bytes)."""
    name, version = _dist_name()
    info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = _metadata().encode("utf-8")
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: queen-locks _build/backend.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    ).encode()
    record = "".join(_record_line(path, data) for path, data in files.items()) + f"{info}/RECORD,,\n"
    files[f"{info}/RECORD"] = record.encode()
    filename = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, filename), "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files.items():
            z.writestr(path, data)
    return filename


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {}
    for path, disk in _sources():
        with open(disk, "rb") as f:
            files[path] = f.read()
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    # An editable install is a .pth file that puts this directory on the path.
    return _wheel(wheel_directory, {f"__editable__.{PACKAGE}.pth": (ROOT + "\n").encode()})


def build_sdist(sdist_directory, config_settings=None):
    name, version = _dist_name()
    base = f"{name}-{version}"
    filename = f"{base}.tar.gz"
    paths = [("pyproject.toml", os.path.join(ROOT, "pyproject.toml")),
             ("README.md", os.path.join(ROOT, "README.md")),
             ("_build/backend.py", os.path.abspath(__file__)), *_sources()]
    with tarfile.open(os.path.join(sdist_directory, filename), "w:gz", format=tarfile.PAX_FORMAT) as t:
        pkg_info = _metadata().encode("utf-8")
        ti = tarfile.TarInfo(f"{base}/PKG-INFO")
        ti.size = len(pkg_info)
        t.addfile(ti, io.BytesIO(pkg_info))
        for path, disk in paths:
            t.add(disk, arcname=f"{base}/{path}")
    return filename
