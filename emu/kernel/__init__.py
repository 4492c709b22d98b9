"""The fake Linux kernel: a declarative syscall table and its handlers by family."""
