package dev.idem.it;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.net.UnixDomainSocketAddress;
import java.nio.ByteBuffer;
import java.nio.channels.SocketChannel;
import java.nio.file.Path;

/**
 * The project's test cluster listens on a Unix socket only, which pgJDBC
 * cannot reach: this forwards 127.0.0.1:port to it. When the application
 * process dies, its connections' TCP ends close and so do their server
 * sessions' sockets, as with a direct connection.
 */
final class UnixSocketForwarder implements AutoCloseable {
    private final ServerSocket server;
    private final Path socket;

    UnixSocketForwarder(Path socket) throws IOException {
        this.socket = socket;
        this.server = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        Thread accept = new Thread(this::acceptLoop, "forwarder-accept");
        accept.setDaemon(true);
        accept.start();
    }

    int port() { return server.getLocalPort(); }

    private void acceptLoop() {
        while (!server.isClosed()) {
            try {
                Socket tcp = server.accept();
                SocketChannel unix = SocketChannel.open(UnixDomainSocketAddress.of(socket));
                // Not Channels.newInputStream/newOutputStream: on one blocking
                // channel they share a lock, and a pending read blocks every write.
                InputStream fromUnix = new InputStream() {
                    @Override public int read() { throw new UnsupportedOperationException(); }
                    @Override public int read(byte[] b, int off, int len) throws IOException {
                        return unix.read(ByteBuffer.wrap(b, off, len));
                    }
                };
                OutputStream toUnix = new OutputStream() {
                    @Override public void write(int b) { throw new UnsupportedOperationException(); }
                    @Override public void write(byte[] b, int off, int len) throws IOException {
                        ByteBuffer buf = ByteBuffer.wrap(b, off, len);
                        while (buf.hasRemaining()) unix.write(buf);
                    }
                };
                pump(tcp.getInputStream(), toUnix, tcp, unix);
                pump(fromUnix, tcp.getOutputStream(), tcp, unix);
            } catch (IOException e) {
                if (!server.isClosed()) e.printStackTrace();
            }
        }
    }

    private static void pump(InputStream in, OutputStream out, Socket tcp, SocketChannel unix) {
        Thread t = new Thread(() -> {
            byte[] buf = new byte[65536];
            try {
                for (int n; (n = in.read(buf)) >= 0; ) {
                    out.write(buf, 0, n);
                    out.flush();
                }
            } catch (IOException ignored) {
                // the other side closed: close both below
            } finally {
                try { tcp.close(); } catch (IOException ignored) { }
                try { unix.close(); } catch (IOException ignored) { }
            }
        }, "forwarder-pump");
        t.setDaemon(true);
        t.start();
    }

    @Override
    public void close() throws IOException { server.close(); }
}
