#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/resource.h>
static char buf[1<<16];
int main(int argc, char **argv){ int fd=open("/tmp/softmm-inference-file", O_RDWR|O_CREAT|O_TRUNC,0644); ftruncate(fd, 8192);
 mmap(0,4096,PROT_READ,MAP_SHARED,fd,0); unlink("/tmp/softmm-inference-file"); mmap(0,4096,PROT_READ,MAP_SHARED,fd,4096);
 int p[2]; pipe(p); mmap(0,4096,PROT_READ,MAP_PRIVATE,p[0],0); mmap(0,4096,PROT_READ,MAP_PRIVATE,p[1],0);
 int e=eventfd(0,0); mmap(0,4096,PROT_READ,MAP_PRIVATE,e,0); mmap(0,0,PROT_READ,MAP_PRIVATE,e,0);
 int s=socket(AF_UNIX,SOCK_STREAM,0); mmap(0,4096,PROT_READ,MAP_PRIVATE,s,0);
 int d=open("/tmp", O_RDONLY|O_DIRECTORY); mmap(0,4096,PROT_READ,MAP_PRIVATE,d,0);
 int d2=open("/tmp", O_RDONLY); mmap(0,4096,PROT_READ,MAP_PRIVATE,d2,0);
 int n=open("/dev/null", O_RDWR); mmap(0,4096,PROT_READ,MAP_PRIVATE,n,0); mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED,n,0);
 int n2=open("/dev/null", O_WRONLY); mmap(0,4096,PROT_READ,MAP_PRIVATE,n2,0); mmap(0,4096,PROT_READ,MAP_PRIVATE,n,1);
 int m=memfd_create("x",0); ftruncate(m,4096); mmap(0,4096,PROT_READ,MAP_SHARED,m,0);
 int m2=memfd_create("x",0); ftruncate(m2,4096); mmap(0,4096,PROT_READ,MAP_SHARED,m2,0);
 int h=memfd_create("hx",MFD_HUGETLB); ftruncate(h,2<<20); mmap(0,2<<20,PROT_READ,MAP_SHARED,h,0);
 struct rlimit rl={16384, 16384}; setrlimit(RLIMIT_MEMLOCK,&rl); mmap(0,32768,PROT_READ,MAP_PRIVATE|MAP_ANONYMOUS|MAP_LOCKED,-1,0);
 if (argc > 1 && fork() == 0) { execl(argv[0], argv[0], (char*)0); }
 if (argc > 1) { int st; wait(&st); }
 if (argc < 2) return 0;
 int in = open("/proc/self/maps", O_RDONLY); int out = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644); ssize_t k;
 while ((k = read(in, buf, sizeof buf)) > 0) write(out, buf, k);
 return 0;}
