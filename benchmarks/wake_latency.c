// How late a thread asleep in epoll_wait wakes after another thread writes its eventfd: the
// machine's share of a completion's lateness, with no Python and no GPU (docs/performance.md,
// "Completion at the GPU's pace"). One JSON line per row: mode 0 sleeps S_us then wakes once;
// mode 1 wakes a first time L_us before the second, timed wake; mode 2 sleeps with an epoll
// timeout of tmo_ms milliseconds. Latencies and the sleeper's CPU in microseconds.
//
//   gcc -O2 -pthread -o wake_latency benchmarks/wake_latency.c && ./wake_latency [REPS]
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static inline int64_t now_ns(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1000000000LL+t.tv_nsec;}
static inline int64_t cpu_ns(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec*1000000000LL+t.tv_nsec;}

typedef struct { int fd; int64_t t[4]; int n; volatile int go; volatile int done; int64_t wrote[4]; } job_t;

static void spin_until(int64_t t){ while(now_ns()<t){} }

static void *writer(void *a){
  job_t *j=a;
  while(!j->go){}
  for(int i=0;i<j->n;i++){ spin_until(j->t[i]); uint64_t one=1; j->wrote[i]=now_ns(); if(write(j->fd,&one,8)!=8) abort();}
  j->done=1; return NULL;
}

static int cmp(const void*a,const void*b){int64_t x=*(int64_t*)a,y=*(int64_t*)b;return x<y?-1:x>y;}

// mode 0: single write at S; 1: pre-poke at S-L then write at S (measure second); 2: single write at S, epoll timeout tmo_ms
static void run(int mode,int S_us,int L_us,int tmo_ms,int reps){
  int64_t *lat=malloc(reps*8),*cpu=malloc(reps*8);
  int efd=eventfd(0,EFD_NONBLOCK); int ep=epoll_create1(0);
  struct epoll_event ev={.events=EPOLLIN,.data.fd=efd}; epoll_ctl(ep,EPOLL_CTL_ADD,efd,&ev);
  for(int r=0;r<reps;r++){
    job_t j; memset(&j,0,sizeof j); j.fd=efd;
    pthread_t th; pthread_create(&th,NULL,writer,&j);
    usleep(2000);
    int64_t t0=now_ns()+20000;
    if(mode==1){ j.n=2; j.t[0]=t0+(int64_t)(S_us-L_us)*1000; j.t[1]=t0+(int64_t)S_us*1000; }
    else { j.n=1; j.t[0]=t0+(int64_t)S_us*1000; }
    j.go=1;
    // the loop: sleep until t0 in a nanosleep (not spinning), then epoll
    struct timespec ts={0,15000}; nanosleep(&ts,NULL);
    int64_t c0=cpu_ns();
    struct epoll_event out; uint64_t v; int64_t woke=0;
    uint64_t got=0;
    while(got<(uint64_t)j.n){
      int rc=epoll_wait(ep,&out,1,mode==2?tmo_ms:-1);
      woke=now_ns();
      if(rc>0 && read(efd,&v,8)==8) got+=v;  // timeout: sleep again
    }
    cpu[r]=cpu_ns()-c0;
    lat[r]=woke-j.wrote[j.n-1];
    pthread_join(th,NULL);
  }
  qsort(lat,reps,8,cmp); qsort(cpu,reps,8,cmp);
  printf("{\"mode\":%d,\"S_us\":%d,\"L_us\":%d,\"tmo_ms\":%d,\"reps\":%d,\"lat_p10\":%.1f,\"lat_p50\":%.1f,\"lat_p90\":%.1f,\"lat_p99\":%.1f,\"cpu_p50\":%.1f}\n",
    mode,S_us,L_us,tmo_ms,reps,lat[reps/10]/1e3,lat[reps/2]/1e3,lat[reps*9/10]/1e3,lat[reps*99/100]/1e3,cpu[reps/2]/1e3);
  fflush(stdout);
  close(efd); close(ep); free(lat); free(cpu);
}

int main(int argc,char**argv){
  int reps=argc>1?atoi(argv[1]):200;
  prctl(PR_SET_TIMERSLACK,1000,0,0,0);
  int S[]={20,50,100,200,300,500,1000,2000,5000};
  for(int i=0;i<9;i++) run(0,S[i],0,0,reps);
  int L[]={30,60,100,150,250};
  int S2[]={1000,5000};
  for(int s=0;s<2;s++) for(int i=0;i<5;i++) run(1,S2[s],L[i],0,reps);
  run(2,900,0,1,reps); run(2,900,0,2,reps); run(2,1500,0,2,reps);
  return 0;
}
