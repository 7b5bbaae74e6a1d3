#!/bin/sh
# The proxy's start (infra/proxy/Dockerfile): one password file per service from the roles' passwords in the
# environment (infra/.env through compose; SHA-512 crypt, readable by nginx's workers only), then nginx.
#   start.sh [FOLDER [nginx arguments...]]     FOLDER: where the files go (default /run/labelshift)
set -eu
folder=${1:-/run/labelshift}
[ $# -gt 0 ] && shift
umask 027
mkdir -p "$folder"

entry() {   # user, the variable holding its password
    eval "password=\${$2:-}"
    if [ -z "$password" ]; then
        echo "proxy: $2 is not set (infra/.env): the $1 role of $3 has no password" >&2
        exit 1
    fi
    hash=$(printf '%s' "$password" | openssl passwd -6 -stdin) || hash=""
    if [ -z "$hash" ]; then
        echo "proxy: openssl could not hash the password of $1 ($2)" >&2
        exit 1
    fi
    printf '%s:%s\n' "$1" "$hash"
}

for service in prefect mlflow; do
    upper=$(echo "$service" | tr a-z A-Z)
    {
        entry operator "LABELSHIFT_${upper}_OPERATOR_PASSWORD" "$service"
        entry worker "LABELSHIFT_${upper}_WORKER_PASSWORD" "$service"
        entry reader "LABELSHIFT_${upper}_READER_PASSWORD" "$service"
    } > "$folder/$service.htpasswd.new"
    mv "$folder/$service.htpasswd.new" "$folder/$service.htpasswd"
done
if id www-data > /dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    chgrp www-data "$folder" "$folder"/*.htpasswd
fi
exec nginx -g 'daemon off;' "$@"
