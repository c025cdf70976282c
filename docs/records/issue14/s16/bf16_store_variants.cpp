#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <random>
using U32x16 = uint32_t __attribute__((vector_size(64)));
template <typename U> U bf16Rounded(U w) { const U r = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16; const U nan = (w >> 16) | 0x40u; return (w & 0x7FFFFFFFu) > 0x7F800000u ? nan : r; }
static inline uint16_t ref(float f){uint32_t w; memcpy(&w,&f,4); uint32_t r=(w+0x7FFFu+((w>>16)&1u))>>16; uint32_t nan=(w>>16)|0x40u; return (w&0x7FFFFFFFu)>0x7F800000u?nan:r;}
static inline float wid(uint16_t b){uint32_t w=uint32_t(b)<<16; float f; memcpy(&f,&w,4); return f;}
__attribute__((noinline)) void v0(uint16_t* o, const uint16_t* a, const uint16_t* b, size_t n){
  for(size_t i=0;i<n;i+=16){
    __m512 x=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(a+i))),16));
    __m512 y=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b+i))),16));
    __m512 s=_mm512_add_ps(x,y);
    __m512i r=(__m512i)bf16Rounded((U32x16)s);
    _mm256_storeu_si256((__m256i*)(o+i), _mm512_cvtepi32_epi16(r));
  }}
__attribute__((noinline)) void v1(uint16_t* o, const uint16_t* a, const uint16_t* b, size_t n){
  const __m512i z=_mm512_setzero_si512();
  for(size_t i=0;i<n;i+=32){
    __m512i xa=_mm512_loadu_si512(a+i), xb=_mm512_loadu_si512(b+i);
    __m512 lo=_mm512_add_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(z,xa)),_mm512_castsi512_ps(_mm512_unpacklo_epi16(z,xb)));
    __m512 hi=_mm512_add_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(z,xa)),_mm512_castsi512_ps(_mm512_unpackhi_epi16(z,xb)));
    __m512i rl=(__m512i)bf16Rounded((U32x16)lo), rh=(__m512i)bf16Rounded((U32x16)hi);
    _mm512_storeu_si512(o+i, _mm512_packus_epi32(rl,rh));
  }}
__attribute__((noinline,target("avx512bf16"))) void v2(uint16_t* o, const uint16_t* a, const uint16_t* b, size_t n){
  const __m512i expm=_mm512_set1_epi32(0x7F800000);
  for(size_t i=0;i<n;i+=32){
    __m512 x0=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(a+i))),16));
    __m512 x1=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(a+i+16))),16));
    __m512 y0=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b+i))),16));
    __m512 y1=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b+i+16))),16));
    __m512 s0=_mm512_add_ps(x0,y0), s1=_mm512_add_ps(x1,y1);
    __mmask16 d0=_mm512_testn_epi32_mask(_mm512_castps_si512(s0),expm), d1=_mm512_testn_epi32_mask(_mm512_castps_si512(s1),expm);
    __m512i r=(__m512i)_mm512_cvtne2ps_pbh(s1,s0);
    if(__builtin_expect(_kortestz_mask16_u8(d0,d1)==0,0)){ // some lane has exponent 0: integer path for the whole register pair
      __m512i rl=(__m512i)bf16Rounded((U32x16)s0), rh=(__m512i)bf16Rounded((U32x16)s1);
      r=_mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(rl)),_mm512_cvtepi32_epi16(rh),1);
    }
    _mm512_storeu_si512(o+i, r);
  }}
__attribute__((noinline)) void v3(uint16_t* o, const uint16_t* a, const uint16_t* b, size_t n){ // unpack widen + vpermt2w narrow (no shift)
  const __m512i z=_mm512_setzero_si512();
  const __m512i idx=_mm512_set_epi16(63,61,59,57,55,53,51,49,47,45,43,41,39,37,35,33,31,29,27,25,23,21,19,17,15,13,11,9,7,5,3,1);
  for(size_t i=0;i<n;i+=32){
    __m512i xa=_mm512_loadu_si512(a+i), xb=_mm512_loadu_si512(b+i);
    __m512 lo=_mm512_add_ps(_mm512_castsi512_ps(_mm512_unpacklo_epi16(z,xa)),_mm512_castsi512_ps(_mm512_unpacklo_epi16(z,xb)));
    __m512 hi=_mm512_add_ps(_mm512_castsi512_ps(_mm512_unpackhi_epi16(z,xa)),_mm512_castsi512_ps(_mm512_unpackhi_epi16(z,xb)));
    U32x16 wl=(U32x16)lo, wh=(U32x16)hi;
    U32x16 rl=(wl&0x7FFFFFFFu)>0x7F800000u ? (wl|0x400000u) : wl+0x7FFFu+((wl>>16)&1u);
    U32x16 rh=(wh&0x7FFFFFFFu)>0x7F800000u ? (wh|0x400000u) : wh+0x7FFFu+((wh>>16)&1u);
    // high words of rl/rh, per 128-bit lane order: packus after >>16 equivalent
    __m512i p=_mm512_packus_epi32(_mm512_srli_epi32((__m512i)rl,16),_mm512_srli_epi32((__m512i)rh,16));
    _mm512_storeu_si512(o+i, p);
  }}
template<class F> double med(F f){ std::vector<double> v; for(int i=0;i<20001;i++){auto t=std::chrono::steady_clock::now(); f(); v.push_back(std::chrono::duration<double,std::micro>(std::chrono::steady_clock::now()-t).count());} std::sort(v.begin(),v.end()); return v[v.size()/2]; }
int main(){
  std::mt19937 g(1); 
  for(size_t bytes: {4096ul,16384ul,65536ul,262144ul}){
    size_t n=bytes/2; std::vector<uint16_t> a(n),b(n),o0(n),o1(n),o2(n),o3(n);
    for(size_t i=0;i<n;i++){ uint32_t r=g(); a[i]=r; b[i]=r>>16; if(i%7==0){a[i]=0x0001+(r&0x7f); b[i]=0x8000|(r>>24);} }
    double t0=med([&]{v0(o0.data(),a.data(),b.data(),n);}), t1=med([&]{v1(o1.data(),a.data(),b.data(),n);}), t2=med([&]{v2(o2.data(),a.data(),b.data(),n);}), t3=med([&]{v3(o3.data(),a.data(),b.data(),n);});
    size_t bad=0; for(size_t i=0;i<n;i++){uint16_t r=ref(wid(a[i])+wid(b[i])); bad+=(o0[i]!=r)+(o1[i]!=r)*100+(o2[i]!=r)*10000+(o3[i]!=r)*1000000;}
    // all-normal data for v2 fast path timing
    for(size_t i=0;i<n;i++){ a[i]=0x3f80+(g()&0x7f); b[i]=0x3f00+(g()&0x7f);} 
    double t2n=med([&]{v2(o2.data(),a.data(),b.data(),n);}), t0n=med([&]{v0(o0.data(),a.data(),b.data(),n);});
    printf("%7zu B: v0 %.2f v1 %.2f v2(denorm-mixed) %.2f v3 %.2f | normal: v0 %.2f v2 %.2f us  bad=%zu\n",bytes,t0,t1,t2,t3,t0n,t2n,bad);
  }
}
