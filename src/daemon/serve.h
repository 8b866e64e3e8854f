/* serve.h - `inferd serve`: the daemon's composition root.  Resolves flags and the config
 * file, sets up logging, starts the HTTP front end at once (so /health answers while the
 * model loads), loads the model, opens the engine, starts the scheduler, tells systemd, and
 * runs until SIGTERM/SIGINT (SIGHUP reopens the request log).  Returns the exit code. */
#ifndef INFERD_DAEMON_SERVE_H
#define INFERD_DAEMON_SERVE_H

int serve_main(int argc, char **argv);

#endif
