#!/usr/bin/env bash
# Make a private CA and TLS certificates for an accy Dask cluster.
#
#   cluster/tls/make-certs.sh [OUTDIR] [DAYS]
#
# OUTDIR defaults to cluster/tls/certs (next to this script); DAYS to 825.
# Writes, into OUTDIR:
#   ca.pem / ca-key.pem               the cluster's own CA (keep ca-key.pem offline)
#   scheduler.pem / scheduler-key.pem
#   worker.pem / worker-key.pem
#   client.pem / client-key.pem
#   dask-tls.yaml                     cluster/tls/dask-tls.yaml with OUTDIR's absolute paths
#   .gitignore                        "*", so the keys are never committed
#
# Dask's TLS is mutual (every side shows a certificate signed by the CA) and
# does not check host names, so one CA is the whole trust model; the names
# below still go into subjectAltName for other tools. Extra names:
#   ACCY_TLS_HOSTS="dask.example.org 10.0.0.5" cluster/tls/make-certs.sh
# Existing files are kept unless FORCE=1.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/certs}"
days="${2:-825}"

command -v openssl >/dev/null || { echo "error: openssl not found" >&2; exit 1; }
mkdir -p "$out"
out="$(cd "$out" && pwd)"
umask 077

if [[ -e "$out/ca.pem" && "${FORCE:-0}" != 1 ]]; then
    echo "error: $out/ca.pem exists; set FORCE=1 to replace the CA and every certificate" >&2
    exit 1
fi

printf '*\n' > "$out/.gitignore"

# The CA.
openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
    -keyout "$out/ca-key.pem" -out "$out/ca.pem" -days "$days" \
    -subj "/O=accy/CN=accy cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

san="DNS:localhost,DNS:scheduler,IP:127.0.0.1,IP:::1"
for h in ${ACCY_TLS_HOSTS:-}; do
    if [[ "$h" =~ ^[0-9.]+$ || "$h" == *:* ]]; then san="$san,IP:$h"; else san="$san,DNS:$h"; fi
done

# One certificate per role. Workers serve and connect; so do schedulers
# (to workers) and clients (to the scheduler): each gets both usages.
for role in scheduler worker client; do
    openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
        -keyout "$out/$role-key.pem" -out "$out/$role.csr" \
        -subj "/O=accy/CN=accy-$role" 2>/dev/null
    openssl x509 -req -in "$out/$role.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
        -CAcreateserial -out "$out/$role.pem" -days "$days" \
        -extfile <(printf '%s\n' \
            "basicConstraints=critical,CA:FALSE" \
            "keyUsage=critical,digitalSignature" \
            "extendedKeyUsage=serverAuth,clientAuth" \
            "subjectKeyIdentifier=hash" \
            "authorityKeyIdentifier=keyid,issuer" \
            "subjectAltName=$san") 2>/dev/null
    rm -f "$out/$role.csr"
    openssl verify -CAfile "$out/ca.pem" "$out/$role.pem" >/dev/null
done
rm -f "$out/ca.srl"

# Certificates are public; keys stay owner-only (umask 077 above).
chmod 644 "$out/ca.pem" "$out/scheduler.pem" "$out/worker.pem" "$out/client.pem"

# A ready config for this folder.
sed "s#: /etc/accy/tls/#: $out/#" "$here/dask-tls.yaml" > "$out/dask-tls.yaml"
chmod 644 "$out/dask-tls.yaml"

echo "wrote CA and scheduler/worker/client certificates to $out"
echo "use: cp $out/dask-tls.yaml next to dask.yaml in your Dask config folder," \
     "then tls://HOST:8786 addresses"
