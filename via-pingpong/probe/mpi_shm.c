/* Open MPI over shared memory, the demo's baseline for via-shm: the best
 * simple use of MPI between two processes of one host (as osu_latency and
 * osu_bw do it). Latency: a 64-byte MPI_Send/MPI_Recv ping-pong, each
 * round trip timed, the median halved. Bandwidth: windows of 64 1 MiB
 * messages (MPI_Isend/MPI_Irecv, then a 4-byte ack), the bytes over the
 * time; one 1 MiB buffer per side, as osu_bw has it and as the demo's VIA
 * bandwidth test has it (its receives share one buffer past their first
 * 4 KiB). Rank 0 prints "lat_us X" and "bw_mbs Y"
 * (MB = 10^6 bytes). Usage: mpi_shm LAT_ITERS BW_WINDOWS */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 64
#define BIG (1 << 20)

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int lat_iters = argc > 1 ? atoi(argv[1]) : 10000;
    int bw_windows = argc > 2 ? atoi(argv[2]) : 16;
    char small[64];
    memset(small, rank, sizeof small);
    double *rt = malloc(sizeof(double) * (size_t)lat_iters);
    int peer = 1 - rank;
    for (int i = -1000; i < lat_iters; i++) { /* 1000 rounds of warm-up */
        double t0 = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(small, 64, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
            MPI_Recv(small, 64, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(small, 64, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(small, 64, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
        }
        if (i >= 0)
            rt[i] = MPI_Wtime() - t0;
    }
    char *big = malloc(BIG);
    memset(big, rank, BIG);
    MPI_Request req[WINDOW];
    int ack = 0;
    double start = 0;
    for (int w = -2; w < bw_windows; w++) { /* 2 windows of warm-up */
        if (w == 0)
            start = MPI_Wtime();
        for (int k = 0; k < WINDOW; k++) {
            if (rank == 0)
                MPI_Isend(big, BIG, MPI_CHAR, peer, 2, MPI_COMM_WORLD, &req[k]);
            else
                MPI_Irecv(big, BIG, MPI_CHAR, peer, 2, MPI_COMM_WORLD, &req[k]);
        }
        MPI_Waitall(WINDOW, req, MPI_STATUSES_IGNORE);
        if (rank == 0)
            MPI_Recv(&ack, 1, MPI_INT, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        else
            MPI_Send(&ack, 1, MPI_INT, peer, 3, MPI_COMM_WORLD);
    }
    double secs = MPI_Wtime() - start;
    if (rank == 0) {
        qsort(rt, (size_t)lat_iters, sizeof(double), cmp);
        printf("lat_us %.4f\n", rt[lat_iters / 2] / 2 * 1e6);
        printf("bw_mbs %.1f\n", (double)bw_windows * WINDOW * BIG / secs / 1e6);
    }
    free(rt);
    free(big);
    MPI_Finalize();
    return 0;
}
