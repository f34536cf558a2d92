// A real HDFS for the tests: a NameNode and one DataNode in this JVM (Hadoop's MiniDFSCluster), with WebHDFS on.
//
//   java -cp "$(classpath of tests/yarn/pom.xml)" tests/hdfs/MiniDfsCluster.java BASE_DIR
//
// Prints one line "READY <namenode RPC port> <namenode HTTP (WebHDFS) port>" and runs until its standard input
// closes or it is killed. Permissions are off (the tests write as any user). Needs Java 11+ (a single source
// file runs without a separate compile step).
import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.HdfsConfiguration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.log4j.BasicConfigurator;
import org.apache.log4j.ConsoleAppender;
import org.apache.log4j.Level;
import org.apache.log4j.Logger;
import org.apache.log4j.PatternLayout;

public class MiniDfsCluster {
    public static void main(String[] args) throws Exception {
        BasicConfigurator.configure(new ConsoleAppender(new PatternLayout("%d %p %c: %m%n"), "System.err"));
        Logger.getRootLogger().setLevel(Level.WARN);
        Configuration conf = new HdfsConfiguration();
        conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(args[0]).getAbsolutePath());
        conf.setBoolean("dfs.webhdfs.enabled", true);
        conf.setBoolean("dfs.permissions.enabled", false);
        // WebHDFS redirects reads and writes to the DataNode by this name.
        conf.set("dfs.datanode.hostname", "127.0.0.1");
        // A nearly full test disk must not stop the NameNode (safe mode on low space).
        conf.setLong("dfs.namenode.resource.du.reserved", 0L);
        MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf).numDataNodes(1).build();
        cluster.waitActive();
        System.out.println("READY " + cluster.getNameNodePort() + " " + cluster.getNameNode().getHttpAddress().getPort());
        System.out.flush();
        while (System.in.read() != -1) {
            // Runs until the test closes the pipe (or the process is killed).
        }
        cluster.shutdown();
    }
}
