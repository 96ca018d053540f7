package cuda

import "golang.org/x/sys/unix"

// newFakeFD makes the fd of an exported fake page: the read end of a new
// pipe, and its inode, by which the fake knows it again.
func newFakeFD() (fd int, id uint64, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return -1, 0, err
	}
	_ = unix.Close(fds[1])
	id, err = fakeFDID(fds[0])
	if err != nil {
		_ = unix.Close(fds[0])
		return -1, 0, err
	}
	return fds[0], id, nil
}

// fakeFDID is the inode of fd.
func fakeFDID(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

// closeFakeFD closes an fd the fake exported.
func closeFakeFD(fd int) error { return unix.Close(fd) }
