# Sourced by the tests of scripts/gpu-check.sh (test_*.sh here): $tmp, a scratch directory removed
# when the test exits, and fail MESSAGE, which says FAIL and ends the test with status 1.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
