"""The buildable sandbox images (``sandboxd images build --profile``), one table read by the
builder (:mod:`sandboxd.cli.images`), the settings (``build_images`` names profiles, checked
when the settings are made, so the table sits with them) and the container backend's own
build (:mod:`sandboxd.backends.container.build`); nothing here imports the command line or
Docker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandboxd.config import Settings


@dataclass(frozen=True)
class Profile:
    """One buildable sandbox image: an optional layer of packages (``deps``, a Dockerfile in
    ``images/`` built FROM the base and tagged ``deps_tag``) under the sandbox set-up."""

    name: str
    summary: str
    tag: str | None = None  # None: the python_image setting
    deps: str | None = None
    deps_tag: str | None = None

    def image(self, settings: Settings) -> str:
        """The image this profile builds (``--tag`` overrides it)."""
        return self.tag or settings.python_image


#: The one list of profiles; the first is the default.
PROFILES: dict[str, Profile] = {p.name: p for p in (
    Profile("python", "python3, git, coreutils, the runner (the default image)"),
    Profile("datascience", "the python image plus numpy, pandas, matplotlib, scipy, "
            "scikit-learn", tag="sandboxd/datascience:latest",
            deps="datascience/Dockerfile", deps_tag="sandboxd/datascience-deps:latest"),
    Profile("javascript", "the python image plus Node.js and the TypeScript compiler (the "
            "javascript and typescript tools' kernel)", tag="sandboxd/javascript:latest",
            deps="javascript/Dockerfile", deps_tag="sandboxd/javascript-deps:latest"),
)}
DEFAULT_PROFILE = next(iter(PROFILES))
