"""Files the passport room ships: its schemas and the example passport.

The canonical copies live at the top of the repository (`schemas/`, `policies/`)
where people read and edit them; `governor/data/` holds symlinks to them so the
package finds them from a source checkout (the editable install) and a built
wheel carries them (setuptools copies the symlinked files).
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"


def data_path(name: str) -> Path:
    """A bundled file, resolved to its canonical location."""
    return (DATA_DIR / name).resolve()


def example_passport_path() -> Path:
    """The bundled example passport (policies/example-passport.yaml): the governor's default."""
    return data_path("example-passport.yaml")
