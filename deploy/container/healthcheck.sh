#!/bin/bash
# Container health check without an HTTP client in the image: GET /healthz on the node's HTTP
# port over bash's /dev/tcp; healthy only on "HTTP/1.x 200". The port is QQ_HEALTH_PORT, else
# the port of QQ_HTTP_ADDR, else 7301 (the image's config).
port=${QQ_HEALTH_PORT:-${QQ_HTTP_ADDR##*:}}
port=${port:-7301}
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' >&3
read -r -t 4 status <&3 || exit 1
case $status in
    "HTTP/1."[01]" 200"*) exit 0 ;;
    *) echo "healthz: ${status:-no answer}" >&2; exit 1 ;;
esac
