/*
 * Airlock's Java kernel: what run_code(..., language="java") runs in the
 * code-interpreter-v1 template. internal/interp/java.go starts one JVM per
 * context and talks to it over a line protocol of its own (not Jupyter's).
 *
 * Cells are evaluated with the JDK's JShell API, split into snippets by
 * SourceCodeAnalysis.analyzeCompletion, so variables, methods, classes and
 * imports persist from one cell to the next. Snippets run in this JVM (an
 * execution engine of our own, built on DirectExecutionControl): no second JVM
 * and no JDI, which costs ~400 ms per cell against ~1-45 ms here.
 *
 * File descriptors:
 *   0  /dev/null: nothing the code starts can read our requests.
 *   1  the code's System.out and what child processes write there, raw; after
 *      each cell the end marker (args[0]) so the reader knows the cell's
 *      output is complete.
 *   2  the same for System.err.
 *   3  requests, one JSON object per line:
 *        {"t":"exec","id":N,"code":"...","env":{"K":"V",...}}
 *        {"t":"interrupt","id":N}
 *   4  events, one JSON object per line:
 *        {"t":"ready","sigint":true|false}           after end markers on fd 1 and 2
 *        {"t":"result","id":N,"text":"..."}            the cell's value
 *        {"t":"error","id":N,"name":..,"value":..,"traceback":..}
 *        {"t":"interrupting","id":N,"running":true|false}
 *        {"t":"done","id":N,"count":C}                 after the end markers
 *        {"t":"fatal","message":"..."}
 *
 * Behaviour follows what E2B's Java kernel (IJava) does: the value of the
 * cell's last snippet is the result when that snippet is an expression (not a
 * declaration or a statement) and not null; a String is shown as itself. The
 * sandbox's env vars and each execution's are system properties as well as
 * process env vars (System.getProperty("FOO"), as E2B documents), an
 * execution's only for that execution. Compile errors are
 * "CompilationException"; an uncaught exception is named by its class.
 *
 * Built with plain javac in the template's Dockerfile; the JVM is started with
 * --add-opens java.base/java.io and java.base/java.util, which the fd and env
 * plumbing below needs.
 */
package airlock.kernel;

import java.io.BufferedOutputStream;
import java.io.BufferedReader;
import java.io.ByteArrayInputStream;
import java.io.FileDescriptor;
import java.io.FileInputStream;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodType;
import java.lang.reflect.Field;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.stream.Collectors;

import jdk.jshell.DeclarationSnippet;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.JShellException;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.execution.DirectExecutionControl;
import jdk.jshell.spi.ExecutionControl;
import jdk.jshell.spi.ExecutionControlProvider;
import jdk.jshell.spi.ExecutionEnv;

public final class AirlockKernel {
    /** Imports every cell starts with, as in the jshell tool and IJava. */
    private static final String[] DEFAULT_IMPORTS = {
        "java.io.*", "java.math.*", "java.net.*", "java.nio.file.*", "java.util.*",
        "java.util.concurrent.*", "java.util.function.*", "java.util.regex.*", "java.util.stream.*",
    };

    private final Object lock = new Object();
    private final PrintStream out;
    private final PrintStream err;
    private final byte[] marker;
    private final OutputStream events;
    private final CellControl control = new CellControl(lock);
    private final JShell shell;
    private final SourceCodeAnalysis analysis;
    private final Map<String, String> env = writableEnv();
    private final LibcEnv libc = LibcEnv.load();

    // Guarded by lock: the cell that runs, and the highest id interrupted (a
    // request may be interrupted before it is taken from the queue).
    private long running = -1;
    private long interruptedUpTo = 0;
    private int count = 0;

    private AirlockKernel(String marker, OutputStream events) {
        this.marker = marker.getBytes(StandardCharsets.UTF_8);
        this.events = events;
        // UTF-8 whatever the locale (a sandbox may have no LANG), buffered but
        // flushed at each line so output streams while a cell runs.
        out = new PrintStream(new BufferedOutputStream(new FileOutputStream(FileDescriptor.out), 8192), true, StandardCharsets.UTF_8);
        err = new PrintStream(new BufferedOutputStream(new FileOutputStream(FileDescriptor.err), 8192), true, StandardCharsets.UTF_8);
        System.setOut(out);
        System.setErr(err);
        System.setIn(new ByteArrayInputStream(new byte[0]));
        shell = JShell.builder()
                .executionEngine(new ExecutionControlProvider() {
                    @Override
                    public String name() {
                        return "airlock";
                    }

                    @Override
                    public ExecutionControl generate(ExecutionEnv env, Map<String, String> parameters) {
                        return control;
                    }
                }, null)
                .in(new ByteArrayInputStream(new byte[0]))
                .out(err)
                .err(err)
                .build();
        analysis = shell.sourceCodeAnalysis();
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: airlock.kernel.AirlockKernel <end marker>");
            System.exit(2);
        }
        OutputStream events = new BufferedOutputStream(new FileOutputStream(fd(4)), 65536);
        AirlockKernel k;
        try {
            k = new AirlockKernel(args[0], events);
            k.start();
        } catch (Throwable t) {
            send(events, obj("t", "fatal", "message", String.valueOf(t)));
            System.exit(1);
            return;
        }
        k.serve(new BufferedReader(new InputStreamReader(new FileInputStream(fd(3)), StandardCharsets.UTF_8)));
    }

    /**
     * A FileDescriptor for an inherited fd. Opening /proc/self/fd/N instead
     * would fail for a kernel that runs as another user than the one who made
     * the pipe (a pipe's inode is its creator's, mode 0600).
     */
    private static FileDescriptor fd(int n) throws ReflectiveOperationException {
        FileDescriptor d = new FileDescriptor();
        Field f = FileDescriptor.class.getDeclaredField("fd");
        f.setAccessible(true);
        f.setInt(d, n);
        return d;
    }

    /**
     * The map behind System.getenv(), which ProcessBuilder copies for child
     * processes; null when the JVM does not let us reach it (then an
     * execution's env is only system properties).
     */
    @SuppressWarnings("unchecked")
    private static Map<String, String> writableEnv() {
        try {
            Map<String, String> ro = System.getenv();
            Field f = ro.getClass().getDeclaredField("m");
            f.setAccessible(true);
            return (Map<String, String>) f.get(ro);
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
    }

    private void start() {
        // The sandbox's env vars are system properties too (E2B's Java
        // contract), without shadowing the JVM's own properties.
        for (Map.Entry<String, String> e : System.getenv().entrySet()) {
            if (System.getProperty(e.getKey()) == null) {
                System.setProperty(e.getKey(), e.getValue());
            }
        }
        // Compiling the imports loads and warms javac, most of a first cell's
        // cost, before the kernel says it is ready.
        for (String imp : DEFAULT_IMPORTS) {
            shell.eval("import " + imp + ";");
        }
        boolean sigint = ignoreSigint();
        // End markers before ready: what the JVM wrote while starting (the
        // incubator module's warning) is not taken for the first cell's.
        out.flush();
        out.write(marker, 0, marker.length);
        out.flush();
        err.flush();
        err.write(marker, 0, marker.length);
        err.flush();
        send(events, obj("t", "ready", "sigint", sigint));
    }

    /**
     * Interrupts reach the cell as a request on fd 3; the SIGINT the Go side
     * then sends to the process group is for the cell's child processes (as
     * ^C reaches a terminal's foreground job), and must not end the JVM.
     */
    private static boolean ignoreSigint() {
        try {
            sun.misc.Signal.handle(new sun.misc.Signal("INT"), sig -> { });
            return true;
        } catch (Throwable t) {
            return false;
        }
    }

    private void serve(BufferedReader requests) throws InterruptedException {
        LinkedBlockingQueue<Map<String, Object>> queue = new LinkedBlockingQueue<>();
        Thread reader = new Thread(() -> {
            try {
                String line;
                while ((line = requests.readLine()) != null) {
                    Map<String, Object> req;
                    try {
                        req = Json.parseObject(line);
                    } catch (IllegalArgumentException e) {
                        continue; // not ours: ignore rather than die
                    }
                    if ("interrupt".equals(req.get("t"))) {
                        interrupt(((Number) req.get("id")).longValue());
                    } else {
                        queue.add(req);
                    }
                }
            } catch (IOException e) {
                // fd 3 broken: same as EOF
            }
            // The Go side closed the requests (Close) or went away: end
            // after what was asked before.
            queue.add(Map.of("t", "eof"));
        }, "airlock-requests");
        reader.setDaemon(true);
        reader.start();
        while (true) {
            Map<String, Object> req = queue.take();
            if ("eof".equals(req.get("t"))) {
                out.flush();
                err.flush();
                Runtime.getRuntime().halt(0);
            }
            if (!"exec".equals(req.get("t"))) {
                continue;
            }
            long id = ((Number) req.get("id")).longValue();
            boolean skip;
            synchronized (lock) {
                skip = id <= interruptedUpTo;
                if (!skip) {
                    running = id;
                    control.cancelled = false;
                }
            }
            if (!skip) {
                count++;
                Object code = req.get("code");
                @SuppressWarnings("unchecked")
                Map<String, Object> cellEnv = req.get("env") instanceof Map ? (Map<String, Object>) req.get("env") : Map.of();
                execute(id, code instanceof String ? (String) code : "", cellEnv);
                synchronized (lock) {
                    running = -1;
                }
            }
            endOfCell(id);
        }
    }

    private void interrupt(long id) {
        boolean wasRunning;
        synchronized (lock) {
            if (id > interruptedUpTo) {
                interruptedUpTo = id;
            }
            wasRunning = running == id;
            if (wasRunning) {
                control.stopCell();
            }
        }
        send(events, obj("t", "interrupting", "id", id, "running", wasRunning));
    }

    private boolean interrupted(long id) {
        synchronized (lock) {
            return id <= interruptedUpTo;
        }
    }

    /** Flushes the cell's output, writes the end markers, then says done. */
    private void endOfCell(long id) {
        for (PrintStream s : new PrintStream[] {System.out, System.err}) {
            if (s != out && s != err) {
                s.flush(); // the code replaced System.out or System.err
            }
        }
        out.flush();
        out.write(marker, 0, marker.length);
        out.flush();
        err.flush();
        err.write(marker, 0, marker.length);
        err.flush();
        send(events, obj("t", "done", "id", id, "count", count));
    }

    private static final Object UNSET = new Object();

    private void execute(long id, String code, Map<String, Object> cellEnv) {
        // The execution's env: system properties and process env, put back
        // as they were after the cell (a sandbox value comes back).
        Map<String, Object> savedProps = new LinkedHashMap<>();
        Map<String, Object> savedEnv = new LinkedHashMap<>();
        for (Map.Entry<String, Object> e : cellEnv.entrySet()) {
            String k = e.getKey();
            String v = String.valueOf(e.getValue());
            if (k.isEmpty()) {
                continue;
            }
            String old = System.getProperty(k);
            savedProps.put(k, old == null ? UNSET : old);
            System.setProperty(k, v);
            if (env != null && k.indexOf('=') < 0 && k.indexOf('\0') < 0 && v.indexOf('\0') < 0) {
                String oldEnv = env.get(k);
                savedEnv.put(k, oldEnv == null ? UNSET : oldEnv);
                env.put(k, v);
                if (libc != null) {
                    libc.set(k, v);
                }
            }
        }
        try {
            run(id, code);
        } finally {
            for (Map.Entry<String, Object> e : savedProps.entrySet()) {
                if (e.getValue() == UNSET) {
                    System.clearProperty(e.getKey());
                } else {
                    System.setProperty(e.getKey(), (String) e.getValue());
                }
            }
            for (Map.Entry<String, Object> e : savedEnv.entrySet()) {
                if (e.getValue() == UNSET) {
                    env.remove(e.getKey());
                    if (libc != null) {
                        libc.unset(e.getKey());
                    }
                } else {
                    env.put(e.getKey(), (String) e.getValue());
                    if (libc != null) {
                        libc.set(e.getKey(), (String) e.getValue());
                    }
                }
            }
        }
    }

    /** Runs a cell snippet by snippet; stops at the first error. */
    private void run(long id, String code) {
        String remaining = code;
        String result = null;
        while (!interrupted(id)) {
            SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(remaining);
            SourceCodeAnalysis.Completeness c = info.completeness();
            if (c == SourceCodeAnalysis.Completeness.EMPTY) {
                break;
            }
            String source = c.isComplete() ? info.source() : remaining;
            remaining = c.isComplete() ? info.remaining() : "";
            control.resetValue();
            List<SnippetEvent> evs = shell.eval(source);
            if (control.stopped()) {
                return; // interrupted: the Go side drops what follows anyway
            }
            SnippetEvent fresh = null;
            for (SnippetEvent ev : evs) {
                if (ev.causeSnippet() == null) {
                    fresh = ev;
                }
            }
            if (fresh == null) {
                // Nothing was made of it: input JShell could not even parse.
                sendError(id, "CompilationException", "could not parse: " + source.strip(), source.strip());
                return;
            }
            if (reportFailure(id, fresh, c.isComplete())) {
                return;
            }
            result = null;
            switch (fresh.snippet().subKind()) {
                case VAR_VALUE_SUBKIND:
                case OTHER_EXPRESSION_SUBKIND:
                case TEMP_VAR_EXPRESSION_SUBKIND:
                    result = control.valueText();
                    break;
                default:
                    break;
            }
        }
        if (result != null && !interrupted(id)) {
            send(events, obj("t", "result", "id", id, "text", result));
        }
    }

    /** Sends the error of a snippet that failed, and says whether it did. */
    private boolean reportFailure(long id, SnippetEvent ev, boolean complete) {
        JShellException ex = ev.exception();
        if (ex instanceof EvalException) {
            EvalException ee = (EvalException) ex;
            String msg = ee.getMessage();
            sendError(id, ee.getExceptionClassName(), msg == null ? "" : msg, stackTrace(ee));
            return true;
        }
        if (ex instanceof UnresolvedReferenceException) {
            UnresolvedReferenceException ure = (UnresolvedReferenceException) ex;
            String deps = shell.unresolvedDependencies(ure.getSnippet()).collect(Collectors.joining(", "));
            String msg = ure.getSnippet().source().strip() + " cannot be used until " + deps + " is declared";
            sendError(id, "UnresolvedReferenceException", msg, msg);
            return true;
        }
        if (ex != null) {
            String msg = ex.getMessage();
            sendError(id, ex.getClass().getSimpleName(), msg == null ? "" : msg, stackTrace(ex));
            return true;
        }
        if (ev.status().isDefined() && complete) {
            return false;
        }
        Snippet sn = ev.snippet();
        StringBuilder tb = new StringBuilder();
        String first = null;
        for (Diag d : shell.diagnostics(sn).collect(Collectors.toList())) {
            if (!d.isError()) {
                continue;
            }
            String m = d.getMessage(Locale.ROOT);
            if (first == null) {
                first = m;
            }
            tb.append(pointAt(sn.source(), (int) d.getStartPosition(), (int) d.getPosition()));
            tb.append(m).append('\n');
        }
        if (first == null && sn instanceof DeclarationSnippet) {
            String deps = shell.unresolvedDependencies((DeclarationSnippet) sn).collect(Collectors.joining(", "));
            if (!deps.isEmpty()) {
                first = "unresolved dependencies: " + deps;
                tb.append(sn.source().strip()).append('\n').append(first).append('\n');
            }
        }
        if (first == null && !complete) {
            first = "incomplete input";
            tb.append(sn.source().strip()).append('\n').append(first).append('\n');
        }
        if (first == null) {
            first = "rejected: " + sn.source().strip();
            tb.append(first).append('\n');
        }
        sendError(id, "CompilationException", first, tb.toString());
        return true;
    }

    /** The source line holding pos, and a caret under the error, as javac prints them. */
    private static String pointAt(String src, int start, int pos) {
        if (pos < 0 || pos > src.length()) {
            return "";
        }
        int from = src.lastIndexOf('\n', Math.max(0, pos - 1) ) + 1;
        if (pos > 0 && pos <= src.length() && pos - 1 >= 0 && src.charAt(pos - 1) == '\n') {
            from = pos;
        }
        int to = src.indexOf('\n', pos);
        if (to < 0) {
            to = src.length();
        }
        String line = src.substring(from, to);
        StringBuilder caret = new StringBuilder();
        for (int i = from; i < pos; i++) {
            caret.append(src.charAt(i) == '\t' ? '\t' : ' ');
        }
        return line + "\n" + caret + "^\n";
    }

    /** A Java-style stack trace, with snippet frames shown as jshell does: (#id:line). */
    private static String stackTrace(JShellException ex) {
        StringBuilder b = new StringBuilder();
        Throwable t = ex;
        boolean first = true;
        while (t != null) {
            String name = t instanceof EvalException ? ((EvalException) t).getExceptionClassName() : t.getClass().getName();
            String msg = t.getMessage();
            b.append(first ? "" : "Caused by: ").append(name).append(msg == null ? "" : ": " + msg).append('\n');
            for (StackTraceElement f : t.getStackTrace()) {
                String file = f.getFileName();
                if (file != null && file.startsWith("#")) {
                    String m = f.getMethodName();
                    b.append("\tat ").append(m == null || m.isEmpty() ? "" : m + " ")
                            .append('(').append(file).append(':').append(f.getLineNumber()).append(")\n");
                } else {
                    b.append("\tat ").append(f).append('\n');
                }
            }
            t = t.getCause();
            first = false;
        }
        return b.toString();
    }

    private void sendError(long id, String name, String value, String traceback) {
        send(events, obj("t", "error", "id", id, "name", name, "value", value, "traceback", traceback));
    }

    private static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    private static void send(OutputStream events, Map<String, Object> m) {
        byte[] line = (Json.encode(m) + "\n").getBytes(StandardCharsets.US_ASCII);
        synchronized (events) {
            try {
                events.write(line);
                events.flush();
            } catch (IOException e) {
                // The Go side is gone: nobody to tell, and nothing left to do.
                Runtime.getRuntime().halt(1);
            }
        }
    }

    /**
     * libc's setenv and unsetenv. A ProcessBuilder whose environment() was
     * never asked for passes the process's C environ to its child, not the map
     * behind System.getenv(), so an execution's env reaches child processes
     * only when environ changes too. Java has no setenv; JDK 17's
     * foreign-function incubator (jdk.incubator.foreign, added to the JVM by
     * java.go) calls libc. It is reached by reflection so this file compiles
     * without that module; load returns null where it is missing (another
     * JDK), and then children see the sandbox's env only.
     */
    static final class LibcEnv {
        private final MethodHandle setenv;
        private final MethodHandle unsetenv;
        private final Method toCString;   // CLinker.toCString(String, ResourceScope)
        private final Method address;     // MemorySegment.address()
        private final Method newScope;    // ResourceScope.newImplicitScope()

        private LibcEnv(MethodHandle setenv, MethodHandle unsetenv, Method toCString, Method address, Method newScope) {
            this.setenv = setenv;
            this.unsetenv = unsetenv;
            this.toCString = toCString;
            this.address = address;
            this.newScope = newScope;
        }

        static LibcEnv load() {
            try {
                Class<?> linkerC = Class.forName("jdk.incubator.foreign.CLinker");
                Class<?> lookupC = Class.forName("jdk.incubator.foreign.SymbolLookup");
                Class<?> addressableC = Class.forName("jdk.incubator.foreign.Addressable");
                Class<?> addrC = Class.forName("jdk.incubator.foreign.MemoryAddress");
                Class<?> layoutC = Class.forName("jdk.incubator.foreign.MemoryLayout");
                Class<?> fdC = Class.forName("jdk.incubator.foreign.FunctionDescriptor");
                Class<?> scopeC = Class.forName("jdk.incubator.foreign.ResourceScope");
                Class<?> segC = Class.forName("jdk.incubator.foreign.MemorySegment");
                Object linker = linkerC.getMethod("getInstance").invoke(null);
                Object lookup = linkerC.getMethod("systemLookup").invoke(null);
                Method find = lookupC.getMethod("lookup", String.class);
                Object cInt = linkerC.getField("C_INT").get(null);
                Object cPtr = linkerC.getField("C_POINTER").get(null);
                Object layouts = java.lang.reflect.Array.newInstance(layoutC, 0);
                Method fdOf = fdC.getMethod("of", layoutC, layouts.getClass());
                Method downcall = linkerC.getMethod("downcallHandle", addressableC, MethodType.class, fdC);
                Object[] three = (Object[]) java.lang.reflect.Array.newInstance(layoutC, 3);
                three[0] = cPtr;
                three[1] = cPtr;
                three[2] = cInt;
                Object[] one = (Object[]) java.lang.reflect.Array.newInstance(layoutC, 1);
                one[0] = cPtr;
                MethodHandle set = (MethodHandle) downcall.invoke(linker,
                        ((java.util.Optional<?>) find.invoke(lookup, "setenv")).orElseThrow(),
                        MethodType.methodType(int.class, addrC, addrC, int.class),
                        fdOf.invoke(null, cInt, three));
                MethodHandle unset = (MethodHandle) downcall.invoke(linker,
                        ((java.util.Optional<?>) find.invoke(lookup, "unsetenv")).orElseThrow(),
                        MethodType.methodType(int.class, addrC),
                        fdOf.invoke(null, cInt, one));
                return new LibcEnv(set, unset, linkerC.getMethod("toCString", String.class, scopeC),
                        segC.getMethod("address"), scopeC.getMethod("newImplicitScope"));
            } catch (Throwable t) {
                return null;
            }
        }

        private Object cString(Object scope, String s) throws ReflectiveOperationException {
            return address.invoke(toCString.invoke(null, s, scope));
        }

        void set(String k, String v) {
            try {
                Object scope = newScope.invoke(null);
                setenv.invokeWithArguments(cString(scope, k), cString(scope, v), 1);
            } catch (Throwable t) {
                // environ keeps its value: children see the sandbox's
            }
        }

        void unset(String k) {
            try {
                unsetenv.invokeWithArguments(cString(newScope.invoke(null), k));
            } catch (Throwable t) {
                // as in set
            }
        }
    }

    /**
     * Runs each snippet's code on a thread of its own, keeps the value it
     * returned (JShell's own engines only hand back a display string, with
     * Strings quoted), and stops that thread on interrupt. Unlike JShell's
     * LocalExecutionControl it neither waits for nor stops the threads the
     * code started in the background, as ^C in Python leaves those alone.
     */
    static final class CellControl extends DirectExecutionControl {
        private final Object lock;
        private Thread cell;           // guarded by lock
        volatile boolean cancelled;    // set under lock: the running cell is interrupted
        private volatile boolean stopped;
        private Object value;
        private String valueText;

        CellControl(Object lock) {
            this.lock = lock;
        }

        void resetValue() {
            value = null;
            valueText = null;
            stopped = false;
        }

        boolean stopped() {
            return stopped;
        }

        /** The last snippet's value as the result's text, or null for no result (void, null). */
        String valueText() {
            return value == null ? null : valueText;
        }

        /** Called under lock. */
        @SuppressWarnings("deprecation") // Thread.stop: JShell's own local engine stops code the same way
        void stopCell() {
            cancelled = true;
            if (cell != null && cell.isAlive()) {
                cell.stop();
            }
        }

        @Override
        public void stop() {
            synchronized (lock) {
                stopCell();
            }
        }

        @Override
        protected String invoke(Method doit) throws Exception {
            Object[] res = new Object[1];
            String[] text = new String[1];
            Throwable[] thrown = new Throwable[1];
            boolean[] died = new boolean[1];
            Thread t = new Thread(() -> {
                try {
                    Object v = doit.invoke(null);
                    res[0] = v;
                    text[0] = render(v);
                } catch (InvocationTargetException e) {
                    if (e.getCause() instanceof ThreadDeath) {
                        died[0] = true;
                    } else {
                        thrown[0] = e;
                    }
                } catch (ThreadDeath e) {
                    died[0] = true;
                } catch (Throwable e) {
                    // toString() of the value threw: the code's exception all the same.
                    thrown[0] = new InvocationTargetException(e);
                }
            }, "airlock-cell");
            synchronized (lock) {
                if (cancelled) {
                    stopped = true;
                    throw new StoppedException();
                }
                cell = t;
                t.start();
            }
            try {
                t.join();
            } finally {
                synchronized (lock) {
                    cell = null;
                }
            }
            if (died[0] || cancelled) {
                stopped = true;
                throw new StoppedException();
            }
            if (thrown[0] != null) {
                throw (Exception) thrown[0];
            }
            value = res[0];
            valueText = text[0];
            return DirectExecutionControl.valueString(res[0]);
        }

        /** How a value reads as a result: a String or char as itself, an array element by element. */
        private static String render(Object v) {
            if (v == null) {
                return null;
            }
            if (v.getClass().isArray()) {
                return DirectExecutionControl.valueString(v);
            }
            return String.valueOf(v);
        }
    }

    /**
     * The little JSON the protocol needs: Java has no JSON library built in.
     * Encoding escapes every character outside printable ASCII, so the output
     * is ASCII and an unpaired surrogate survives as an escape.
     */
    static final class Json {
        static String encode(Object v) {
            StringBuilder b = new StringBuilder();
            write(b, v);
            return b.toString();
        }

        private static void write(StringBuilder b, Object v) {
            if (v == null) {
                b.append("null");
            } else if (v instanceof String) {
                quote(b, (String) v);
            } else if (v instanceof Boolean || v instanceof Integer || v instanceof Long) {
                b.append(v);
            } else if (v instanceof Map) {
                b.append('{');
                boolean first = true;
                for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                    if (!first) {
                        b.append(',');
                    }
                    first = false;
                    quote(b, String.valueOf(e.getKey()));
                    b.append(':');
                    write(b, e.getValue());
                }
                b.append('}');
            } else {
                quote(b, String.valueOf(v));
            }
        }

        private static void quote(StringBuilder b, String s) {
            b.append('"');
            for (int i = 0; i < s.length(); i++) {
                char c = s.charAt(i);
                if (c == '"' || c == '\\') {
                    b.append('\\').append(c);
                } else if (c == '\n') {
                    b.append("\\n");
                } else if (c == '\t') {
                    b.append("\\t");
                } else if (c < 0x20 || c > 0x7e) {
                    b.append(String.format("\\u%04x", (int) c));
                } else {
                    b.append(c);
                }
            }
            b.append('"');
        }

        @SuppressWarnings("unchecked")
        static Map<String, Object> parseObject(String s) {
            Parser p = new Parser(s);
            Object v = p.value();
            p.ws();
            if (p.i != s.length() || !(v instanceof Map)) {
                throw new IllegalArgumentException("not one JSON object");
            }
            return (Map<String, Object>) v;
        }

        private static final class Parser {
            final String s;
            int i;

            Parser(String s) {
                this.s = s;
            }

            void ws() {
                while (i < s.length() && " \t\r\n".indexOf(s.charAt(i)) >= 0) {
                    i++;
                }
            }

            IllegalArgumentException bad() {
                return new IllegalArgumentException("bad JSON at " + i);
            }

            char peek() {
                if (i >= s.length()) {
                    throw bad();
                }
                return s.charAt(i);
            }

            Object value() {
                ws();
                char c = peek();
                if (c == '{') {
                    i++;
                    Map<String, Object> m = new LinkedHashMap<>();
                    ws();
                    if (peek() == '}') {
                        i++;
                        return m;
                    }
                    while (true) {
                        ws();
                        if (peek() != '"') {
                            throw bad();
                        }
                        String k = string();
                        ws();
                        if (peek() != ':') {
                            throw bad();
                        }
                        i++;
                        m.put(k, value());
                        ws();
                        char d = peek();
                        i++;
                        if (d == '}') {
                            return m;
                        }
                        if (d != ',') {
                            throw bad();
                        }
                    }
                }
                if (c == '[') {
                    i++;
                    List<Object> l = new ArrayList<>();
                    ws();
                    if (peek() == ']') {
                        i++;
                        return l;
                    }
                    while (true) {
                        l.add(value());
                        ws();
                        char d = peek();
                        i++;
                        if (d == ']') {
                            return l;
                        }
                        if (d != ',') {
                            throw bad();
                        }
                    }
                }
                if (c == '"') {
                    return string();
                }
                if (s.startsWith("true", i)) {
                    i += 4;
                    return Boolean.TRUE;
                }
                if (s.startsWith("false", i)) {
                    i += 5;
                    return Boolean.FALSE;
                }
                if (s.startsWith("null", i)) {
                    i += 4;
                    return null;
                }
                int start = i;
                while (i < s.length() && "+-0123456789.eE".indexOf(s.charAt(i)) >= 0) {
                    i++;
                }
                if (start == i) {
                    throw bad();
                }
                String num = s.substring(start, i);
                try {
                    return num.matches("-?\\d+") ? (Object) Long.valueOf(num) : (Object) Double.valueOf(num);
                } catch (NumberFormatException e) {
                    throw bad();
                }
            }

            String string() {
                i++; // the opening quote
                StringBuilder b = new StringBuilder();
                while (true) {
                    char c = peek();
                    i++;
                    if (c == '"') {
                        return b.toString();
                    }
                    if (c != '\\') {
                        b.append(c);
                        continue;
                    }
                    char e = peek();
                    i++;
                    switch (e) {
                        case '"': b.append('"'); break;
                        case '\\': b.append('\\'); break;
                        case '/': b.append('/'); break;
                        case 'b': b.append('\b'); break;
                        case 'f': b.append('\f'); break;
                        case 'n': b.append('\n'); break;
                        case 'r': b.append('\r'); break;
                        case 't': b.append('\t'); break;
                        case 'u':
                            if (i + 4 > s.length()) {
                                throw bad();
                            }
                            try {
                                b.append((char) Integer.parseInt(s.substring(i, i + 4), 16));
                            } catch (NumberFormatException ex) {
                                throw bad();
                            }
                            i += 4;
                            break;
                        default:
                            throw bad();
                    }
                }
            }
        }
    }
}
