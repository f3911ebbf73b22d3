#!/usr/bin/env bash
# Start a throwaway PostgreSQL server (Debian `postgresql` package) for the search-storage test.
#
# Usage (from .ci/run):   eval "$(scripts/start_postgres.sh)"
#         stop it with:   scripts/start_postgres.sh stop
#
# stdout carries exactly one line, `export CHARON_TEST_POSTGRES_URL=...`, so `eval` sets the
# variable; every message goes to stderr. The server listens only on a Unix socket in its own
# directory (no TCP port), trusts local connections and lives under $CHARON_PG_DIR
# (default /tmp/charon-pg). Running as root, the server runs as the `postgres` system user (the
# server refuses to run as root). If no server binary exists, the Debian package is installed
# with apt-get (needs root and the Debian mirror).
set -euo pipefail

PG_DIR="${CHARON_PG_DIR:-/tmp/charon-pg}"
PG_PORT="${CHARON_PG_PORT:-54329}"
DB_NAME="${CHARON_PG_DB:-charon_test}"
DATA="$PG_DIR/data"
SOCK="$PG_DIR/sock"

log() { echo "start_postgres: $*" >&2; }

find_bindir() {
    local d
    for d in /usr/lib/postgresql/*/bin; do
        if [ -x "$d/postgres" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
            echo "$d"
        fi
    done | sort -V | tail -n 1
}

BIN="$(find_bindir || true)"
if [ -z "$BIN" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "no PostgreSQL server binary found; installing the Debian package"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 \
            || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive \
                 apt-get install -y -q postgresql >&2; }
        BIN="$(find_bindir || true)"
    fi
    if [ -z "$BIN" ]; then
        log "no PostgreSQL server found (apt-get install postgresql)"
        exit 1
    fi
fi

# Run a command as the server's owner.
if [ "$(id -u)" = 0 ]; then
    OWNER=postgres
    as_owner() { runuser -u "$OWNER" -- "$@"; }
else
    OWNER="$(id -un)"
    as_owner() { "$@"; }
fi

pg() { as_owner "$BIN/pg_ctl" -D "$DATA" "$@"; }

if [ "${1:-start}" = "stop" ]; then
    if [ -f "$DATA/postmaster.pid" ]; then
        pg stop -m fast >&2
    fi
    exit 0
fi

mkdir -p "$PG_DIR" "$SOCK"
if [ "$(id -u)" = 0 ]; then
    chown -R "$OWNER" "$PG_DIR"
fi

if [ ! -f "$DATA/PG_VERSION" ]; then
    log "initdb $DATA ($BIN)"
    as_owner "$BIN/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-sync >/dev/null
fi

if ! as_owner "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
    log "starting the server (socket $SOCK, port $PG_PORT)"
    # fsync off: a test database, thrown away after the run.
    pg start -w -t 60 -l "$PG_DIR/server.log" \
        -o "-c listen_addresses='' -k $SOCK -p $PG_PORT -c fsync=off -c max_connections=50" >&2
fi

if ! as_owner "$BIN/psql" -h "$SOCK" -p "$PG_PORT" -U postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname='$DB_NAME'" | grep -q 1; then
    as_owner "$BIN/createdb" -h "$SOCK" -p "$PG_PORT" -U postgres "$DB_NAME"
fi

log "ready"
echo "export CHARON_TEST_POSTGRES_URL='postgresql+psycopg2://postgres@/$DB_NAME?host=$SOCK&port=$PG_PORT'"
