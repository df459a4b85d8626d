# Shared by scripts/setup.sh and scripts/setup-test.sh (sourced, not run).
# SETUP_NAME names the script in error messages.

step() { printf '\n==> %s\n' "$*"; }

die() {
	printf '%s: %s\n' "${SETUP_NAME:-setup}" "$*" >&2
	exit 1
}

need_root() {
	if [ "$(id -u)" -ne 0 ]; then
		die "run as root ($1)"
	fi
}

# install_missing PKG...: apt-get installs those of the Debian packages that are
# not installed yet, so a re-run on a prepared machine touches nothing.
install_missing() {
	local missing=() p status
	for p in "$@"; do
		status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
		if [ "$status" != "installed" ]; then
			missing+=("$p")
		fi
	done
	if [ ${#missing[@]} -eq 0 ]; then
		echo "all $# packages already installed"
		return
	fi
	echo "installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	apt-get install -y --no-install-recommends "${missing[@]}"
}
