# Sourced by tools/quickstart.sh, lint.sh and run_tests.sh: .venv with eigtrain installed editable with the extras
# given (`venv_install` or `venv_install '[dev]'`). A stamp in .venv records what was installed for which
# pyproject.toml, setup.py and package directories (setup.py lists the config groups from configs/), so the next
# script in one CI run does not build and resolve the same install again (each `pip install -e` builds the package
# in an isolated environment: ~20 s on 2 cores).
venv_install() {
  local extras=${1:-} stamp=.venv/eigtrain-install.stamp tree
  [ -x .venv/bin/python ] || python3 -m venv .venv
  tree=$( (cat pyproject.toml setup.py; ls -d configs/*/ launch eigtrain/*/) | sha256sum | cut -c1-16)
  if [ -f "$stamp" ] && grep -qxF -- "$extras $tree" "$stamp"; then return 0; fi
  # the dev extra adds tools only: an install with it serves a request without extras (CI installs once)
  if [ -z "$extras" ] && [ -f "$stamp" ] && grep -qxF -- "[dev] $tree" "$stamp"; then return 0; fi
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".$extras"
  echo "$extras $tree" >> "$stamp"
}
