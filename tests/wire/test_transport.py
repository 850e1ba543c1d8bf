"""Channel over real MPI ranks: arrays intact, in order per sender, a Shutdown noted (real mpiexec)."""

from __future__ import annotations

from mpi_jobs import run_script

RANKS = (
    "import numpy as np\n"
    "from mpi4py import MPI\n"
    "from areal_hpc.wire.messages import Shutdown, TrainShard, Trajectory\n"
    "from areal_hpc.wire.transport import Channel\n"
    "chan = Channel(MPI.COMM_WORLD)\n"
    "def batch(rank, k):\n"
    "    n = 100_000 if k == 1 else 10  # 400 kB arrays go out of band\n"
    "    ids = np.arange(n, dtype=np.int32) + rank\n"
    "    t = Trajectory(rank, k, [1, 2], ids, ids / n, ids * 0 + k, 'stop')\n"
    "    return TrainShard(k, 0, [t], [0.5], [[0]], t.num_tokens - 1, 1, 0.5)\n"
    "if chan.rank == 0:\n"
    "    seen = {1: [], 2: []}\n"
    "    while len(seen[1]) + len(seen[2]) < 6:\n"
    "        sender, msg = chan.recv(timeout=30)\n"
    "        assert msg == batch(sender, len(seen[sender])), (sender, msg.version)\n"
    "        assert msg.trajectories[0].logprobs.dtype == np.float32\n"
    "        seen[sender].append(msg.version)\n"
    "    assert seen == {1: [0, 1, 2], 2: [0, 1, 2]}, seen\n"
    "    for rank in (1, 2):\n"
    "        chan.send(rank, Shutdown())\n"
    "    assert chan.flush() and not chan.shutdown_seen\n"
    "    print('rank 0 ok', flush=True)\n"
    "else:\n"
    "    for k in range(3):\n"
    "        chan.send(0, batch(chan.rank, k))\n"
    "    _, msg = chan.recv(0, timeout=30)\n"
    "    assert isinstance(msg, Shutdown) and chan.shutdown_seen and chan.flush()\n"
)


def test_messages_arrive_whole_and_in_order_from_each_sender():
    proc = run_script(3, RANKS)
    assert proc.returncode == 0 and "rank 0 ok" in proc.stdout, proc.stdout + proc.stderr
