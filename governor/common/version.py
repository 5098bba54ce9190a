"""The governor's version, as `governor --version` and the webhooks' User-Agent report it."""

from __future__ import annotations

DISTRIBUTION = "adl-governor"


def package_version() -> str:
    """The installed distribution's version; the source tree's when not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        from governor import __version__

        return __version__
