// A real YARN cluster for the tests: one ResourceManager and N NodeManagers in this JVM (Hadoop's
// MiniYARNCluster), with an HDFS (MiniDFSCluster: a NameNode and a DataNode, WebHDFS on) as the default file
// system, as on a real YARN cluster: Spark stages each application's files there, and an archive kept there
// with world-readable permissions is YARN's PUBLIC resource, unpacked once per NodeManager for every job.
//
//   java -cp "$(classpath of tests/yarn/pom.xml)" tests/yarn/MiniYarnCluster.java CONF_DIR [NODE_MANAGERS]
//
// Writes CONF_DIR/yarn-site.xml and CONF_DIR/core-site.xml (point HADOOP_CONF_DIR at CONF_DIR), then prints
// one line "READY <resourcemanager address> <fs.defaultFS> <WebHDFS port>" and runs until its standard input
// closes or it is killed.
// The NodeManagers' memory checks are off: the containers run TensorFlow processes on a small machine.
// The NodeManagers' local file system sets permissions in this process (InProcessChmodFs), as Hadoop's native
// library does on a real cluster: without it (Maven Central does not ship libhadoop.so) Hadoop starts one
// chmod process per file, and unpacking a packed virtualenv of 39,000 files took about two minutes of that.
// Needs Java 11+ (a single source file runs without a separate compile step).
import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;
import java.net.URISyntaxException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.ChecksumFs;
import org.apache.hadoop.fs.DelegateToFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.log4j.BasicConfigurator;
import org.apache.log4j.ConsoleAppender;
import org.apache.log4j.Level;
import org.apache.log4j.Logger;
import org.apache.log4j.PatternLayout;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;

public class MiniYarnCluster {
    static final String LOCAL_FS = "fs.AbstractFileSystem.file.impl";

    /** The local file system of Hadoop's FileContext, whose setPermission is a system call, not a process. */
    public static class InProcessChmodFs extends ChecksumFs {
        public InProcessChmodFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(new Raw(uri, conf));
        }
    }

    static class Raw extends DelegateToFileSystem {
        Raw(URI uri, Configuration conf) throws IOException, URISyntaxException {
            super(uri, new Chmod(), conf, "file", false);
        }

        @Override
        public int getUriDefaultPort() {
            return -1;
        }

        @Override
        public boolean isValidName(String src) {
            return true;
        }
    }

    static class Chmod extends RawLocalFileSystem {
        private static final PosixFilePermission[] BITS = {
            PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
            PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
            PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ};

        @Override
        public void setPermission(Path p, FsPermission permission) throws IOException {
            short mode = permission.toShort();
            if ((mode & ~0777) != 0) {  // a sticky bit: only chmod sets it
                super.setPermission(p, permission);
                return;
            }
            Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
            for (int i = 0; i < BITS.length; i++) {
                if ((mode & (1 << i)) != 0) {
                    set.add(BITS[i]);
                }
            }
            Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
        }
    }

    public static void main(String[] args) throws Exception {
        Thread.currentThread().setContextClassLoader(MiniYarnCluster.class.getClassLoader());
        File confDir = new File(args[0]);
        int nodeManagers = args.length > 1 ? Integer.parseInt(args[1]) : 2;
        // The servers' own log: warnings and errors on standard error.
        BasicConfigurator.configure(new ConsoleAppender(new PatternLayout("%d %p %c: %m%n"), "System.err"));
        Logger.getRootLogger().setLevel(Level.WARN);
        YarnConfiguration conf = new YarnConfiguration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File("hdfs").getAbsolutePath());
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.set("dfs.datanode.hostname", "127.0.0.1");
        conf.setLong("dfs.namenode.resource.du.reserved", 0L);
        conf.setInt("dfs.replication", 1);
        conf.setClassLoader(MiniYarnCluster.class.getClassLoader());
        conf.set(LOCAL_FS, InProcessChmodFs.class.getName());
        MiniDFSCluster dfs = new MiniDFSCluster.Builder(conf).numDataNodes(1).build();
        dfs.waitActive();
        conf.set("fs.defaultFS", dfs.getFileSystem().getUri().toString());
        // A nearly full test disk must not mark the NodeManagers unhealthy.
        conf.set("yarn.nodemanager.disk-health-checker.max-disk-utilization-per-disk-percentage", "100.0");
        conf.setBoolean("yarn.nodemanager.pmem-check-enabled", false);
        conf.setBoolean("yarn.nodemanager.vmem-check-enabled", false);
        // Memory and vcores are only YARN's accounting here: room on one NodeManager for two of
        // conf/spark-defaults.yarn.conf's executors (14 GiB, 4 vcores each) and an application master.
        conf.setInt("yarn.nodemanager.resource.memory-mb", 40960);
        // (MiniYARNCluster gives its NodeManagers this one, 4096 by default, instead of the one above.)
        conf.setInt("yarn.minicluster.yarn.nodemanager.resource.memory-mb", 40960);
        conf.setInt("yarn.nodemanager.resource.cpu-vcores", 16);
        conf.setInt("yarn.scheduler.minimum-allocation-mb", 256);
        conf.setInt("yarn.scheduler.maximum-allocation-mb", 40960);
        // The capacity scheduler's default gives application masters 10% of the memory: too little here.
        conf.set("yarn.scheduler.capacity.maximum-am-resource-percent", "0.5");
        // The capacity scheduler's one queue (a real cluster reads these from capacity-scheduler.xml).
        conf.set("yarn.scheduler.capacity.root.queues", "default");
        conf.set("yarn.scheduler.capacity.root.default.capacity", "100");
        MiniYARNCluster cluster = new MiniYARNCluster("spark-imagenet-tests", nodeManagers, 1, 1);
        cluster.init(conf);
        cluster.start();
        Configuration started = cluster.getConfig();
        // start() may return before the ResourceManager has written its bound port into the configuration.
        while (started.get(YarnConfiguration.RM_ADDRESS, "").endsWith(":0")) {
            Thread.sleep(100);
        }
        confDir.mkdirs();
        // What the clients read: without MiniDFSCluster's rack mapping, a test class that Spark's Hadoop client
        // lacks (ClassNotFoundException: org.apache.hadoop.net.StaticMapping).
        Configuration client = new Configuration(started);
        client.unset("net.topology.node.switch.mapping.impl");
        client.unset(LOCAL_FS);  // a class of this file, which clients do not have
        for (String name : new String[] {"yarn-site.xml", "core-site.xml"}) {
            try (OutputStream out = new FileOutputStream(new File(confDir, name))) {
                client.writeXml(out);
            }
        }
        System.out.println("READY " + started.get(YarnConfiguration.RM_ADDRESS) + " " + started.get("fs.defaultFS")
                           + " " + dfs.getNameNode().getHttpAddress().getPort());
        System.out.flush();
        while (System.in.read() != -1) {
            // Runs until the test closes the pipe (or the process is killed).
        }
        cluster.stop();
        dfs.shutdown();
    }
}
