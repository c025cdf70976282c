#include <stdio.h>
#include <time.h>
#include <stdlib.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
volatile int sink;
int main(int argc,char**argv){ int usepause=atoi(argv[1]);
 for(int r=0;r<6;r++){ int over=0; double mx=0, tot=0;
  for(int k=0;k<2000;k++){double a=now(); if(usepause) for(int i=0;i<4000;i++) __builtin_ia32_pause(); else for(int i=0;i<4000*40;i++) sink=i; double b=now(); tot+=b-a; if(b-a>mx)mx=b-a; if(b-a>1.5*tot/(k+1)) over++;}
  printf("pause=%d mean %.1f us max %.1f us, slow(>1.5x mean) %d/2000\n",usepause, tot/2000/1e3, mx/1e3, over);} }
