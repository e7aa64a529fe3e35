"""What holds the slice, through an engine: the image's /etc as the engine made it
(its /etc/hosts, /etc/hostname, /etc/resolv.conf written and read), a user added,
and the tenant's one-line ways out of the slice refused (a user namespace under the
engine's own seccomp profile too: podman's allows unshare) (tests/runtime/test_tenant.py
has each alone, through runc)."""
from tests.engines.conftest import PROBE, filled_to_the_limit

# the image's own work, then the tenant's tries, then a CUDA program
IMAGE_WORK = ("ls /etc; echo '10.1.1.1 db' >> /etc/hosts && grep -q '^10.1.1.1 db$' /etc/hosts && echo HOSTS-WRITTEN; "
              "test -s /etc/hostname && echo HOSTNAME=ok; "
              "echo 'app:x:1000:1000::/:/bin/sh' >> /etc/passwd && id app")
# (on overlayfs a directory of the image moves by copy: /usr/local's copy is made, and
# its mount point, /usr/local/vgpu/libvgpu.so, stays where it is)
TRIES = ("mv /etc /etc.x; mv /.hami /h; mv /etc/ld.so.preload /etc/p; chroot / true; "
         "unshare -Urm sh -c 'mount --bind /dev/null /etc/ld.so.preload' || echo UNSHARE-REFUSED; "
         "mv /usr/local /usr/l; test -x /usr/l/bin/vgpu-probe && echo USR-LOCAL-MOVED")
SCRIPT = f"{IMAGE_WORK}; {TRIES}; {PROBE.replace('/usr/local/', '/usr/l/')} fill"
REFUSED = ["mv: can't rename '/etc': Device or resource busy",
           "mv: can't rename '/.hami': Device or resource busy",
           "mv: can't rename '/etc/ld.so.preload': Device or resource busy",
           "chroot: can't change root directory to '/': Operation not permitted"]


def etc_listing(out: str) -> list:
    """`ls /etc`'s names (one a line, up to HOSTS-WRITTEN), less the preload."""
    names = []
    for line in out.splitlines():
        if line == "HOSTS-WRITTEN":
            break
        names.append(line)
    return [n for n in names if n != "ld.so.preload"]


def check(gpu, plain) -> None:
    """`gpu` ran SCRIPT with a 1024 MiB slice, `plain` IMAGE_WORK with no GPU request."""
    assert gpu.returncode == 0, gpu.stdout + gpu.stderr
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert etc_listing(gpu.stdout) == etc_listing(plain.stdout), (plain.stdout, gpu.stdout)
    for line in ("HOSTS-WRITTEN", "HOSTNAME=ok", "uid=1000(app) gid=1000 groups=1000", "UNSHARE-REFUSED",
                 "USR-LOCAL-MOVED"):
        assert line in gpu.stdout.splitlines(), (line, gpu.stdout)
    assert all(line in gpu.stderr.splitlines() for line in REFUSED), gpu.stderr
    filled_to_the_limit(gpu.stdout, 1024)
