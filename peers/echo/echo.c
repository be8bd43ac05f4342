/* The test workload image's only program (tests/node.rs), static, built by
 * scripts/peers.sh and packed as an OCI image by scripts/testbed-node.sh.
 *
 *   echo serve          answers HTTP on TCP 8080 ("HTTP/1.0 200 OK", then
 *                       the pod's hostname) and UDP 8081 (the hostname back
 *                       to the sender), until SIGTERM/SIGINT.
 *   echo probe ADDR...  for each address: an HTTP GET on 8080 and a UDP
 *                       datagram to 8081, each within 3 s; one line per
 *                       address and protocol ("ADDR tcp NAME" or "ADDR tcp
 *                       FAIL reason") to stdout and /dev/termination-log
 *                       (so the API shows it); exit 0 when all answered.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define TCP_PORT 8080
#define UDP_PORT 8081

static void stop(int sig) { _exit(128 + sig); }

/* A socket address for ADDR (v4 or v6) and PORT; its length, 0 if bad. */
static socklen_t sockaddr_of(const char *addr, int port, struct sockaddr_storage *ss) {
  memset(ss, 0, sizeof *ss);
  struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
  if (inet_pton(AF_INET, addr, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    return sizeof *v4;
  }
  if (inet_pton(AF_INET6, addr, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    return sizeof *v6;
  }
  return 0;
}

static int listener(int type, int port) {
  int fd = socket(AF_INET6, type, 0);
  int off = 0, on = 1;
  if (fd < 0)
    return -1;
  setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  struct sockaddr_in6 a = {0};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_any;
  a.sin6_port = htons(port);
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0)
    return -1;
  if (type == SOCK_STREAM && listen(fd, 64) < 0)
    return -1;
  return fd;
}

static int serve(void) {
  char name[256] = "unknown";
  gethostname(name, sizeof name - 1);
  int tcp = listener(SOCK_STREAM, TCP_PORT), udp = listener(SOCK_DGRAM, UDP_PORT);
  if (tcp < 0 || udp < 0) {
    perror("echo: listen");
    return 1;
  }
  printf("echo: serving %s on tcp %d, udp %d\n", name, TCP_PORT, UDP_PORT);
  fflush(stdout);
  struct pollfd fds[2] = {{tcp, POLLIN, 0}, {udp, POLLIN, 0}};
  for (;;) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR)
        continue;
      return 1;
    }
    if (fds[0].revents & POLLIN) {
      int c = accept(tcp, NULL, NULL);
      if (c >= 0) {
        char req[1024], resp[512];
        struct timeval tv = {2, 0};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        (void)!read(c, req, sizeof req);
        int n = snprintf(resp, sizeof resp, "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n%s\n", name);
        (void)!write(c, resp, n);
        close(c);
      }
    }
    if (fds[1].revents & POLLIN) {
      char buf[512];
      struct sockaddr_storage from;
      socklen_t len = sizeof from;
      if (recvfrom(udp, buf, sizeof buf, 0, (struct sockaddr *)&from, &len) >= 0)
        sendto(udp, name, strlen(name), 0, (struct sockaddr *)&from, len);
    }
  }
}

/* Writes one result line to stdout and to the termination log. */
static void report(FILE *log, const char *line) {
  fputs(line, stdout);
  if (log)
    fputs(line, log);
}

static int probe_tcp(const char *addr, char *out, size_t outlen) {
  struct sockaddr_storage ss;
  socklen_t len = sockaddr_of(addr, TCP_PORT, &ss);
  if (!len)
    return snprintf(out, outlen, "bad address"), -1;
  int fd = socket(ss.ss_family, SOCK_STREAM, 0);
  struct timeval tv = {3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
    snprintf(out, outlen, "connect: %s", strerror(errno));
    close(fd);
    return -1;
  }
  const char *req = "GET / HTTP/1.0\r\n\r\n";
  (void)!write(fd, req, strlen(req));
  char buf[1024];
  size_t got = 0;
  ssize_t n;
  while (got < sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
    got += n;
  close(fd);
  buf[got] = 0;
  char *body = strstr(buf, "\r\n\r\n");
  if (strncmp(buf, "HTTP/1.0 200", 12) != 0 || !body) {
    snprintf(out, outlen, "bad answer (%zu bytes)", got);
    return -1;
  }
  body += 4;
  body[strcspn(body, "\r\n")] = 0;
  snprintf(out, outlen, "%s", body);
  return 0;
}

static int probe_udp(const char *addr, char *out, size_t outlen) {
  struct sockaddr_storage ss;
  socklen_t len = sockaddr_of(addr, UDP_PORT, &ss);
  if (!len)
    return snprintf(out, outlen, "bad address"), -1;
  int fd = socket(ss.ss_family, SOCK_DGRAM, 0);
  struct timeval tv = {3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&ss, len) < 0 || send(fd, "hello", 5, 0) < 0) {
    snprintf(out, outlen, "send: %s", strerror(errno));
    close(fd);
    return -1;
  }
  char buf[256];
  ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
  close(fd);
  if (n <= 0) {
    snprintf(out, outlen, "no answer: %s", n < 0 ? strerror(errno) : "empty");
    return -1;
  }
  buf[n] = 0;
  snprintf(out, outlen, "%s", buf);
  return 0;
}

static int probe(int argc, char **argv) {
  FILE *log = fopen("/dev/termination-log", "w");
  int failed = 0;
  for (int i = 0; i < argc; i++) {
    char what[300], line[400];
    int bad = probe_tcp(argv[i], what, sizeof what);
    snprintf(line, sizeof line, "%s tcp %s%s\n", argv[i], bad ? "FAIL " : "", what);
    report(log, line);
    failed |= bad;
    bad = probe_udp(argv[i], what, sizeof what);
    snprintf(line, sizeof line, "%s udp %s%s\n", argv[i], bad ? "FAIL " : "", what);
    report(log, line);
    failed |= bad;
  }
  if (log)
    fclose(log);
  return failed ? 1 : 0;
}

int main(int argc, char **argv) {
  struct sigaction sa = {0};
  sa.sa_handler = stop;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 2 && strcmp(argv[1], "serve") == 0)
    return serve();
  if (argc >= 2 && strcmp(argv[1], "probe") == 0)
    return probe(argc - 2, argv + 2);
  fprintf(stderr, "usage: echo serve | echo probe ADDR...\n");
  return 2;
}
