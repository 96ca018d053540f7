package ipc

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// fetchPidfd copies the exporter's page fds into this process with
// pidfd_getfd, trusting no fd number on its own word: it first fetches the
// share's authentication memfd and checks that it holds the descriptor's
// token and fd numbers, then checks every page fetched against the
// identities it lists, then fetches the auth memfd again and checks it is
// still the same file (the exporter closes it before the pages: see
// handles.NewAuth). A stale or forged descriptor gets ErrNotOffered. The
// new fds are close-on-exec. A share made for one importer has a claim
// memfd: it is fetched with the pages (and checked against the auth's
// list), and returned for the caller to claim and close; nil otherwise.
// On failure nothing is left open.
func fetchPidfd(d *handles.Descriptor) ([]*handles.FD, *handles.FD, error) {
	if d.Kind != handles.KindPosixFD || len(d.PageFDs) == 0 {
		return nil, nil, fmt.Errorf("descriptor carries no fd numbers: %w", vmm.ErrNotSupported)
	}
	if !d.HasAuth {
		return nil, nil, fmt.Errorf("descriptor (wire version %d, from an older exporter) has fd numbers but no authentication fd; bare fd numbers are not trusted: %w",
			handles.VersionNoAuth, vmm.ErrNotSupported)
	}
	pidfd, err := unix.PidfdOpen(d.ExporterPID, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("pidfd_open(%d): %w", d.ExporterPID, syscallErr(err))
	}
	defer unix.Close(pidfd)
	auth, err := getfd(pidfd, d, d.AuthFD, "the authentication memfd")
	if err != nil {
		return nil, nil, err
	}
	defer auth.Close()
	a, err := d.CheckAuth(auth.Int())
	if err != nil {
		return nil, nil, fmt.Errorf("%w (%w)", ErrNotOffered, err)
	}
	fds, err := fetchPages(pidfd, d, a.Pages)
	var claim *handles.FD
	if err == nil && a.Claim != nil {
		claim, err = fetchClaim(pidfd, d, *a.Claim)
	}
	if err == nil {
		err = recheckAuth(pidfd, d, auth)
	}
	if err != nil {
		return nil, nil, errors.Join(err, handles.CloseAll(fds), handles.CloseAll([]*handles.FD{claim}))
	}
	return fds, claim, nil
}

// fetchClaim copies the share's claim memfd and checks it is the file the
// authentication memfd names.
func fetchClaim(pidfd int, d *handles.Descriptor, ref handles.FileRef) (*handles.FD, error) {
	fd, err := getfd(pidfd, d, ref.FD, "the claim memfd")
	if err != nil {
		return nil, err
	}
	if id, err := handles.FileIDOf(fd.Int()); err != nil || id != ref.ID {
		return nil, errors.Join(fmt.Errorf("fd %d of pid %d is not the share's claim memfd (%v): %w", ref.FD, d.ExporterPID, err, ErrNotOffered), fd.Close())
	}
	return fd, nil
}

// getfd copies fd n of the exporter. EBADF (nothing open there) means the
// share is gone or never was: ErrNotOffered.
func getfd(pidfd int, d *handles.Descriptor, n int, what string) (*handles.FD, error) {
	raw, err := unix.PidfdGetfd(pidfd, n, 0)
	if err != nil {
		if errors.Is(err, unix.EBADF) {
			err = fmt.Errorf("%w (%w)", ErrNotOffered, err)
		}
		return nil, fmt.Errorf("pidfd_getfd of %s (fd %d of pid %d): %w", what, n, d.ExporterPID, syscallErr(err))
	}
	return handles.NewFD(raw)
}

// fetchPages copies every page fd and checks each is the file the
// authentication memfd names. On failure it closes what it fetched.
func fetchPages(pidfd int, d *handles.Descriptor, ids []handles.FileID) ([]*handles.FD, error) {
	fds := make([]*handles.FD, 0, len(d.PageFDs))
	for i, n := range d.PageFDs {
		fd, err := getfd(pidfd, d, n, fmt.Sprintf("page %d", i))
		if err == nil {
			fds = append(fds, fd)
			var id handles.FileID
			if id, err = handles.FileIDOf(fd.Int()); err == nil && id != ids[i] {
				err = fmt.Errorf("page %d: fd %d of pid %d is not the file the share was made of: %w", i, n, d.ExporterPID, ErrNotOffered)
			}
		}
		if err != nil {
			return nil, errors.Join(err, handles.CloseAll(fds))
		}
	}
	return fds, nil
}

// recheckAuth fetches the authentication memfd again: if the same file is
// still there, the share was not closed before the pages were fetched.
func recheckAuth(pidfd int, d *handles.Descriptor, auth *handles.FD) error {
	again, err := getfd(pidfd, d, d.AuthFD, "the authentication memfd, again")
	if err != nil {
		return fmt.Errorf("the share closed while its pages were fetched: %w", err)
	}
	defer again.Close()
	a, err := handles.FileIDOf(auth.Int())
	if err != nil {
		return err
	}
	b, err := handles.FileIDOf(again.Int())
	if err == nil && a != b {
		err = fmt.Errorf("the share closed while its pages were fetched (fd %d of pid %d is another file now): %w", d.AuthFD, d.ExporterPID, ErrNotOffered)
	}
	return err
}

// waitGone waits until process pid has exited (or was never there) and
// returns true, or returns false once one of stop is closed first. It
// polls the process's pidfd, waking every pollEvery to look at stop; a
// pidfd it cannot open for another reason than ESRCH (EMFILE) it tries
// again then: ending the hold on a live claimant could hand its pages to
// someone else under its reads.
func waitGone(pid int, every time.Duration, stop ...<-chan struct{}) bool {
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			_ = unix.Close(pidfd)
		}
	}()
	fds := []unix.PollFd{{Events: unix.POLLIN}}
	for {
		for _, c := range stop {
			select {
			case <-c:
				return false
			default:
			}
		}
		if pidfd < 0 {
			var err error
			if pidfd, err = unix.PidfdOpen(pid, 0); errors.Is(err, unix.ESRCH) {
				return true
			} else if err != nil {
				pidfd = -1
				time.Sleep(every)
				continue
			}
			fds[0].Fd = int32(pidfd)
		}
		if n, _ := unix.Poll(fds, int(every.Milliseconds())); n > 0 {
			return true
		}
	}
}

// syscallErr adds vmm.ErrNotSupported to ENOSYS, keeping the errno.
func syscallErr(err error) error {
	if errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("%w (%w)", vmm.ErrNotSupported, err)
	}
	return err
}
