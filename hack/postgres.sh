#!/usr/bin/env bash
# Starts a throwaway PostgreSQL on loopback for the fencing example's test,
# installing it from Debian's packages when it is missing. Prints the
# connection string; stop it with: hack/postgres.sh stop DIR
set -euo pipefail
port=${PGPORT_TEST:-55432}
if [[ ${1:-} == stop ]]; then
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$2/data" -m fast stop >/dev/null
  rm -rf "$2"
  exit 0
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  echo ">> installing postgresql from Debian's packages" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
dir=$(mktemp -d /tmp/queen-locks-pg.XXXXXX)
chown postgres "$dir"
# initdb refuses to run as root: run the server as the postgres user.
runuser -u postgres -- "$pgbin/initdb" -D "$dir/data" -A trust -U postgres >/dev/null
runuser -u postgres -- "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
  -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
echo "$dir"
echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
