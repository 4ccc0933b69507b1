from pathlib import Path

import pytest

from services.common.config import ConfigError
from services.common.sites import load_sites

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_site_file_loads():
    files = sorted((ROOT / "deploy/sites").glob("*.yaml"))
    assert files
    for path in files:
        sites = load_sites(path)
        assert sites.training_site.name
        assert sites.generation_sites


def test_two_site_roles_and_links():
    sites = load_sites(ROOT / "deploy/sites/local-two-site.yaml")
    assert sites.training_site.name == "train-site"
    assert [s.name for s in sites.generation_sites] == ["gen-site"]
    assert sites.cross_site("gen-site", "train-site")
    assert not sites.cross_site("gen-site", "gen-site")
    with pytest.raises(KeyError, match="no site 'nowhere'"):
        sites.site("nowhere")


def _write(tmp_path, text):
    path = tmp_path / "sites.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("sites: []", "sites"),
        ("sites:\n- {name: a, roles: [generation], work_pool: p}", "exactly one site must have the role 'training'"),
        ("sites:\n- {name: a, roles: [training], work_pool: p}", "at least one site must have the role 'generation'"),
        ("sites:\n- {name: a, roles: [training], work_pool: p}\n- {name: a, roles: [generation], work_pool: q}",
         "site names must be unique"),
        ("sites:\n- {name: a, roles: [training], work_pool: p}\n- {name: b, roles: [generation], work_pool: p}",
         "its own work pool"),
        ("sites:\n- {name: A!, roles: [training, generation], work_pool: p}", "sites.0.name"),
        ("sites:\n- {name: a, roles: [cooking], work_pool: p}", "sites.0.roles.0"),
        ("sites:\n- {name: a, roles: [training, generation], work_pool: p, sgs_port: 70000}", "sites.0.sgs_port"),
        ("sites: [", "not YAML"),
    ],
)
def test_bad_site_files_name_the_file_and_the_rule(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_sites(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)
