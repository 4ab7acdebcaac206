"""`make setup` installs with uv from the package sources pip is configured with
(scripts/pip_index_args.py): pip's settings become uv's arguments, the environment's winning."""

import importlib.util

from conftest import REPO

spec = importlib.util.spec_from_file_location("pip_index_args", REPO / "scripts" / "pip_index_args.py")
pip_index_args = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pip_index_args)


def test_pips_sources_become_uvs_arguments_with_the_environment_winning():
    listing = "\n".join([
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.find-links='/opt/wheels'",
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        "install.index-url='https://mirror.example/simple'",
        ":env:.find-links='/srv/wheels'",
        ":env:.disable-pip-version-check='1'",
    ])
    assert pip_index_args.uv_args(listing) == [
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/srv/wheels", "--constraint", "/etc/xdg/pip/constraints.txt"]


def test_no_configuration_is_no_arguments_and_no_index_is_kept():
    assert pip_index_args.uv_args("") == []
    assert pip_index_args.uv_args("global.no-index='true'\nglobal.find-links='/w'") == [
        "--find-links", "/w", "--no-index"]
