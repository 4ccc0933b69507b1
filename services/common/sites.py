"""Site config: where each part of a deployment runs and how the sites reach each other.

A deployment spans one or more sites (datacenters). Each site names the roles it hosts
(``generation``: SGS instances and their local weight relay; ``training``: the trainer and the
master relay), the host other sites use to reach its services, the ports of those services
(0 = any free port, for one-machine runs), and the Prefect work pool whose workers run the site's
service flow. Traffic between two different sites is a cross-site link: it is the link that
carries one copy of each weight version, and the one TLS protects when ``tls.enabled``.
Shipped files: ``deploy/sites/``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from services.common.config import StrictModel, load_model

Role = Literal["generation", "training"]


class SiteConfig(StrictModel):
    """One site: a datacenter (or, on one machine, a group of processes standing in for one)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{0,62}$", description="Site name (lower case, digits, dashes).")
    roles: list[Role] = Field(min_length=1, description="What runs here: generation, training, or both.")
    host: str = Field("127.0.0.1", min_length=1, description="Address other sites use to reach this site's services.")
    work_pool: str = Field(min_length=1, description="Prefect work pool whose workers run this site's service flow.")
    sgs_port: int = Field(0, ge=0, le=65535, description="SGS port on this site (0 = any free port).")
    router_port: int = Field(
        0, ge=0, le=65535,
        description="SGS router port on this site (0 = any free port); the router fronts the site's instances when "
        "the run routes.",
    )
    relay_port: int = Field(0, ge=0, le=65535, description="Weight relay port on this site (0 = any free port).")
    relay_tls_port: int = Field(
        0, ge=0, le=65535,
        description="Weight relay port for other sites (mutual TLS when tls.enabled; 0 = any free port).",
    )


class TlsConfig(StrictModel):
    """TLS on cross-site links (loopback traffic inside a site stays plaintext)."""

    enabled: bool = Field(False, description="Use TLS with client certificates on cross-site links.")
    dir: str = Field(".cache/certs", description="Where `braid certs` writes the CA and per-site certificates.")


class SitesConfig(StrictModel):
    """All sites of a deployment: exactly one hosts training, at least one hosts generation."""

    sites: list[SiteConfig] = Field(min_length=1, description="The sites.")
    tls: TlsConfig = Field(default_factory=TlsConfig)

    @model_validator(mode="after")
    def _consistent(self) -> SitesConfig:
        names = [s.name for s in self.sites]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"site names must be unique; repeated: {dupes}")
        pools = [s.work_pool for s in self.sites]
        shared = sorted({p for p in pools if pools.count(p) > 1})
        if shared:
            raise ValueError(f"each site needs its own work pool; shared: {shared}")
        training = [s.name for s in self.sites if "training" in s.roles]
        if len(training) != 1:
            raise ValueError(f"exactly one site must have the role 'training'; found {training or 'none'}")
        if not any("generation" in s.roles for s in self.sites):
            raise ValueError("at least one site must have the role 'generation'")
        return self

    def site(self, name: str) -> SiteConfig:
        for s in self.sites:
            if s.name == name:
                return s
        raise KeyError(f"no site {name!r}; sites: {[s.name for s in self.sites]}")

    @property
    def training_site(self) -> SiteConfig:
        return next(s for s in self.sites if "training" in s.roles)

    @property
    def generation_sites(self) -> list[SiteConfig]:
        return [s for s in self.sites if "generation" in s.roles]

    def cross_site(self, a: str, b: str) -> bool:
        """True when traffic between sites ``a`` and ``b`` crosses a site-to-site link."""
        return self.site(a).name != self.site(b).name


def load_sites(path: str | Path, overrides: list[str] | None = None) -> SitesConfig:
    """Load and validate a site file; ``ConfigError`` names the file, the field and the rule."""
    return load_model(SitesConfig, path, overrides)
