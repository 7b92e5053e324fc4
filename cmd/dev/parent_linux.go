package main

import "syscall"

// stopWithParent asks the kernel to send us SIGTERM when our parent dies, so
// a SIGTERM to `make dev` (make does not pass it on) still stops the control
// plane cleanly instead of leaving etcd and kube-apiserver behind.
func stopWithParent() {
	const prSetPdeathsig = 1
	_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, prSetPdeathsig, uintptr(syscall.SIGTERM), 0)
}
