"""File-system syscalls, one module per family (the Linux source file each follows in brackets).

    fdtable.py     the descriptor table: descriptor -> open file, flags, close-on-exec (fs/file.c)
    namei.py       path arguments (getname) and lookup, procfs/sysfs served by the kernel (fs/namei.c)
    open_.py       open, openat, creat, access, faccessat, faccessat2, umask (fs/open.c)
    read_write.py  read, write, pread64, pwrite64, readv, writev, lseek (fs/read_write.c)
    stat_.py       stat, fstat, lstat, newfstatat, statx, readlink, readlinkat (fs/stat.c)
    statfs.py      statfs, fstatfs (fs/statfs.c)
    dirs.py        getcwd, chdir, fchdir, getdents64 (fs/d_path.c, fs/open.c, fs/readdir.c)
    fds.py         dup, dup2, dup3, close, close_range, fcntl, fsync, fdatasync, fadvise64 (fs/file.c, fs/fcntl.c)
    ioctl.py       ioctl (fs/ioctl.c)
    xattr.py       the *xattr calls (fs/xattr.c)
    names.py       mkdir, mknod, symlink, link, unlink, rmdir, rename and their *at forms (fs/namei.c)
    attrs.py       chmod, chown, truncate, fallocate, utimensat and their forms (fs/attr.c, fs/open.c)
    mapped.py      msync and the write-back of shared mappings of the guest's files (mm/msync.c)
    layer.py       what a change checks first (permissions, names), EROFS on a read-only mount

The host's tree is read-only; the guest's changes go to an in-memory layer (overlay.py), or are
EROFS under ``--read-only``. Pipes, sockets and the event descriptors are kernel objects of their own
(pipe.py, net.py, events.py); fs/read_write.py reads and writes them through ``k_read``/``k_write``.
"""
