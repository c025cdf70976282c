#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
__attribute__((target("avx2"))) static void cp(char* d, const char* s, size_t n, int nt){
  for(size_t i=0;i<n;i+=64){ __m256i a=_mm256_load_si256((const __m256i*)(s+i)),b=_mm256_load_si256((const __m256i*)(s+i+32));
    if(nt){_mm256_stream_si256((__m256i*)(d+i),a);_mm256_stream_si256((__m256i*)(d+i+32),b);} else {_mm256_store_si256((__m256i*)(d+i),a);_mm256_store_si256((__m256i*)(d+i+32),b);} } if(nt)_mm_sfence(); }
__attribute__((target("avx2"))) static void dual(char* d1, char* d2, const char* s, size_t n, int nt){
  for(size_t i=0;i<n;i+=64){ __m256i a=_mm256_load_si256((const __m256i*)(s+i)),b=_mm256_load_si256((const __m256i*)(s+i+32));
    if(nt){_mm256_stream_si256((__m256i*)(d1+i),a);_mm256_stream_si256((__m256i*)(d1+i+32),b);} else {_mm256_store_si256((__m256i*)(d1+i),a);_mm256_store_si256((__m256i*)(d1+i+32),b);}
    _mm256_store_si256((__m256i*)(d2+i),a);_mm256_store_si256((__m256i*)(d2+i+32),b); } if(nt)_mm_sfence(); }
int main(){
  size_t sizes[]={131072,524288,8388608}; size_t M=16<<20;
  char* s=aligned_alloc(4096,M); char* d1=aligned_alloc(4096,M); char* d2=aligned_alloc(4096,M); memset(s,1,M);memset(d1,0,M);memset(d2,0,M);
  for(int k=0;k<3;k++) for(int nt=0;nt<2;nt++){ size_t n=sizes[k]; int it=(int)(200000000/n)+10; double best[2]={1e9,1e9};
    for(int rep=0;rep<7;rep++){ double t0=now(); for(int i=0;i<it;i++){ cp(d1,s,n,nt); memcpy(d2,s,n); __asm__ volatile(""::"r"(d2):"memory");} double t1=now(); for(int i=0;i<it;i++) dual(d1,d2,s,n,nt); double t2=now();
      double a=(t1-t0)/it*1e6,b=(t2-t1)/it*1e6; if(a<best[0])best[0]=a; if(b<best[1])best[1]=b;}
    printf("%8zu B %s: slot(nt?)+memcpy own %8.2f us, mixed dual %8.2f us, dual/two %.2f\n",n,nt?"streaming":"cached   ",best[0],best[1],best[1]/best[0]); }
}
