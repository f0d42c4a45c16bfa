"""Shell completion of names (Typer `autocompletion=` callbacks): models, profiles, hardware profiles and
engine logs. Each reads the configuration the way the command would; none may fail or print into the
user's shell, so any error completes nothing."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from stack.cli.every_command import cli_config
from stack.cli.log_files import engine_logs as found


def _safe(names: Callable[[], Iterable[str]], incomplete: str) -> list[str]:
    try:
        found = set(names())
    except Exception:  # a broken config or an unreachable gateway: complete nothing rather than crash
        return []
    return sorted(n for n in found if n.startswith(incomplete))


def models(incomplete: str) -> list[str]:
    """Configured models, and the models the running gateway serves (aliases included)."""

    def names() -> list[str]:
        from stack.manager.client import admin

        cfg = cli_config()
        found = list(cfg.models)
        try:
            for m in admin(cfg.state_dir, "GET", "/admin/models", timeout=1).get("models", []):
                found += [m["model"], *m.get("aliases", [])]
        except Exception:  # nothing running: the configured names only
            pass
        return found

    return _safe(names, incomplete)


def profiles_and_models(incomplete: str) -> list[str]:
    def names() -> list[str]:
        cfg = cli_config()
        return [*cfg.profiles, *cfg.models, "auto"]

    return _safe(names, incomplete)


def hardware(incomplete: str) -> list[str]:
    return _safe(lambda: cli_config().hardware, incomplete)


def engine_logs(incomplete: str) -> list[str]:
    return _safe(lambda: found(cli_config().state_dir / "logs"), incomplete)
