"""Where instances execute (threads now, worker processes for isolation) and client shared memory."""
