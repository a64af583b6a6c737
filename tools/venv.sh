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
  if ! uv_install "$extras"; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".$extras"
  fi
  echo "$extras $tree" >> "$stamp"
}

# uv installs what pip would (pip's indexes, links and constraints, the best version over all indexes as pip takes
# it) in a third of the time: it downloads, unpacks and byte-compiles in parallel (the dev extra, ~6 GB with torch's
# CUDA libraries, on 2 cores with a cold cache: uv 74 s, pip 222 s). Compiled at install as pip does: where
# PYTHONDONTWRITEBYTECODE is set, as on this project's machines, nothing compiles later and every process compiles
# torch again (the suite took 23 min instead of 14.5). Where pip's configuration holds a setting this does not pass
# on, or uv cannot be installed or fails, pip installs instead.
uv_install() {
  local extras=$1 line key value v cert=${SSL_CERT_FILE:-}
  local args=(--python .venv/bin/python --index-strategy unsafe-best-match)
  while IFS= read -r line; do  # e.g. global.find-links='/opt/wheels', :env:.default-timeout='180'
    case ${line%%.*} in global | install | :env:) ;; *) continue ;; esac  # other sections: other pip commands
    key=${line%%=*}; key=${key#*.}; value=${line#*=}; value=${value#\'}; value=${value%\'}
    case $key in
      index-url) args+=(--index-url "$value") ;;
      extra-index-url) for v in $value; do args+=(--extra-index-url "$v"); done ;;
      find-links) for v in $value; do args+=(--find-links "$v"); done ;;
      constraint) for v in $value; do args+=(--constraint "$v"); done ;;
      cert) cert=$value ;;
      timeout | default-timeout | disable-pip-version-check | progress-bar | no-color | no-input | quiet) ;;
      *) echo "venv: pip's configuration sets $key, which uv is not given: installing with pip" >&2; return 1 ;;
    esac
  done < <(.venv/bin/python -m pip config list 2>/dev/null)
  .venv/bin/python -m pip install -q --disable-pip-version-check uv || return 1
  env ${cert:+SSL_CERT_FILE="$cert"} .venv/bin/python -m uv pip install -q --compile-bytecode "${args[@]}" \
    -e ".$extras" && return 0
  echo "venv: uv could not install .$extras: installing with pip" >&2
  return 1
}
