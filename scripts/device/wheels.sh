# Sourced by the GPU scripts: the wheels a device call carries (.whl: the serve stack's, .whl-ray: Ray's), which the
# device's Python 3.12 image lacks.
#   carried_wheels DIR...  install every *.whl in the folders into /tmp/site (none there: nothing to install;
#                          SKIP_WHEELS set: skip, for dry runs on a machine that has the packages), then put /tmp/site
#                          and the checkout first on PYTHONPATH and /tmp/site/bin on PATH. Returns pip's status.
carried_wheels() {
  local wheels=() dir wheel rc=0
  for dir in "$@"; do
    for wheel in "$dir"/*.whl; do [ -e "$wheel" ] && wheels+=("$wheel"); done
  done
  if [ -z "${SKIP_WHEELS:-}" ] && [ ${#wheels[@]} -gt 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "${wheels[@]}" || rc=$?
  fi
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
  return $rc
}
