// The shared-memory wire's hand-off without the engine or the device:
// two processes (CPU 0 and 1) ping-pong through shared memory. Mode 0:
// one cache line handed back and forth (the demo's shm-floor). Mode 1:
// each side receives on a ring of 128 slots STRIDE bytes apart (the
// wire's are 64 KiB apart); a message writes its slot's second line (64
// bytes of payload), then the first (its sequence word, release); the
// receiver spins on the sequence word and reads the payload. Mode 2: the
// same with the wire's cache-line hints (shm/line_hints.rs): the sender
// demotes both lines once published (CLDEMOTE) and owns the next slot's
// second line for writing (PREFETCHW). Prints the median one-way ns of N
// round trips (after 1000 of warm-up). For the wire's two states and its
// hints (docs/DESIGN-NOTES.md): where does a message's time go, the
// ring's lines or the code around them?
//   cc -O2 -o ring_probe ring_probe.c
//   ./ring_probe 0 64 100000; ./ring_probe 1 65536 100000; ./ring_probe 2 65536 100000
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>
#define SLOTS 128
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
// The hints in inline assembly (no -m flag needed; NOPs where absent):
// cldemote [s], cldemote [s+64], prefetchw [next+64].
static void publish_hints(char*s,char*next){
  __asm__ volatile("cldemote (%0)"::"r"(s):"memory");
  __asm__ volatile("cldemote (%0)"::"r"(s+64):"memory");
  __asm__ volatile("prefetchw (%0)"::"r"(next+64):"memory");
}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  int mode=atoi(argv[1]); long stride=atol(argv[2]); int n=atoi(argv[3]);
  size_t ring=SLOTS*stride; size_t sz=2*ring+4096;
  char*m=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  memset(m,0,sz);
  volatile uint64_t*line=(volatile uint64_t*)(m+2*ring);
  char*rx[2]={m,m+ring}; // rx[i]: the ring side i receives on
  double*t=malloc(sizeof(double)*n);
  pid_t p=fork(); int me=p==0?1:0; pin(me);
  char payload[64]; memset(payload,7,64);
  int hints=mode==2;
  for(long i=1;i<=n+1000;i++){
    double t0=0;
    if(me==0){ t0=now();
      if(mode==0){ *line=2*i-1; while(*line!=2*i) _mm_pause(); }
      else { char*s=rx[1]+((i-1)%SLOTS)*stride; memcpy(s+64,payload,64); __atomic_store_n((uint64_t*)s,i,__ATOMIC_RELEASE);
             if(hints) publish_hints(s,rx[1]+(i%SLOTS)*stride);
             char*r=rx[0]+((i-1)%SLOTS)*stride; while(__atomic_load_n((uint64_t*)r,__ATOMIC_ACQUIRE)!=i) _mm_pause(); memcpy(payload,r+64,64); }
      if(i>1000) t[i-1001]=(now()-t0)/2;
    } else {
      if(mode==0){ while(*line!=2*i-1) _mm_pause(); *line=2*i; }
      else { char*r=rx[1]+((i-1)%SLOTS)*stride; while(__atomic_load_n((uint64_t*)r,__ATOMIC_ACQUIRE)!=i) _mm_pause(); memcpy(payload,r+64,64);
             char*s=rx[0]+((i-1)%SLOTS)*stride; memcpy(s+64,payload,64); __atomic_store_n((uint64_t*)s,i,__ATOMIC_RELEASE);
             if(hints) publish_hints(s,rx[0]+(i%SLOTS)*stride); }
    }
  }
  if(me==1) return 0;
  wait(0); qsort(t,n,sizeof(double),cmp); printf("%.0f ",t[n/2]); return 0;
}
